//! The LIST page: a PodList body, each pod reduced to its facts as the `items` array is
//! read.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};

use super::pod::LeanPod;
use super::{PodListPage, skip};
use crate::core::PodFacts;

/// A page body; the pods are converted one by one as the `items` array is read.
pub(super) struct PageBody(pub(super) PodListPage);

fields!(ListField {
    "metadata" => Metadata,
    "items" => Items,
});

// As kube's `ObjectList`: `metadata` optional, `items` required but `null`
// is empty, each at most once.
deserialize_from!(map, PageBody, "a PodList", |map| {
    let mut meta: Option<ListMeta> = None;
    let mut pods: Option<Vec<PodFacts>> = None;
    while let Some(key) = map.next_key::<ListField>()? {
        match key {
            ListField::Metadata if meta.is_some() => {
                return Err(de::Error::duplicate_field("metadata"));
            }
            ListField::Metadata => meta = Some(map.next_value()?),
            ListField::Items if pods.is_some() => {
                return Err(de::Error::duplicate_field("items"));
            }
            ListField::Items => {
                let items: Option<Items> = map.next_value()?;
                pods = Some(items.map(|i| i.0).unwrap_or_default());
            }
            ListField::Other => skip(&mut map)?,
        }
    }
    let pods = pods.ok_or_else(|| de::Error::missing_field("items"))?;
    let meta = meta.unwrap_or_default();
    Ok(PageBody(PodListPage {
        pods,
        resource_version: meta.resource_version,
        continue_token: meta.continue_token,
        remaining_item_count: meta.remaining_item_count,
    }))
});

/// The `metadata` of a list.
#[derive(Default)]
struct ListMeta {
    resource_version: Option<String>,
    continue_token: Option<String>,
    remaining_item_count: Option<i64>,
}

fields!(ListMetaField {
    "resourceVersion" => ResourceVersion,
    "continue" => Continue,
    "remainingItemCount" => RemainingItemCount,
});

deserialize_from!(map, ListMeta, "ListMeta", |map| {
    let mut meta = ListMeta::default();
    while let Some(key) = map.next_key::<ListMetaField>()? {
        match key {
            ListMetaField::ResourceVersion => meta.resource_version = map.next_value()?,
            ListMetaField::Continue => meta.continue_token = map.next_value()?,
            ListMetaField::RemainingItemCount => {
                meta.remaining_item_count = map.next_value()?;
            }
            ListMetaField::Other => skip(&mut map)?,
        }
    }
    Ok(meta)
});

/// The `items` array, each pod reduced to its facts as soon as it is read.
struct Items(Vec<PodFacts>);

deserialize_from!(seq, Items, "a list of pods", |seq| {
    let mut pods = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
    while let Some(pod) = seq.next_element::<LeanPod<'de>>()? {
        pods.push(pod.facts);
    }
    Ok(Items(pods))
});
