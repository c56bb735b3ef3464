//! Watch events: a line of a pod watch, its `object` decoded by its `type`.

use std::borrow::Cow;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, Visitor};

use super::pod::LeanPod;
use super::{Str, WatchEvent, WatchStatus, WatchedPod, skip};

/// A watch event line.
pub(super) struct EventBody(pub(super) WatchEvent);

fields!(EventField {
    "type" => Type,
    "object" => Object,
});

/// The event types, as kube's `WatchEvent` names them.
const EVENT_TYPES: &[&str] = &["ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"];

#[derive(Clone, Copy)]
enum EventType {
    Added,
    Modified,
    Deleted,
    Bookmark,
    Error,
}

impl EventType {
    fn parse<E: de::Error>(name: &str) -> Result<Self, E> {
        Ok(match name {
            "ADDED" => Self::Added,
            "MODIFIED" => Self::Modified,
            "DELETED" => Self::Deleted,
            "BOOKMARK" => Self::Bookmark,
            "ERROR" => Self::Error,
            other => return Err(de::Error::unknown_variant(other, EVENT_TYPES)),
        })
    }
}

/// The `object` of an event whose `type` came first (as the API server sends it), or
/// kept as a `Value` until the type is known.
enum EventObject {
    Decoded(Box<WatchEvent>),
    Pending(serde_json::Value),
}

deserialize_from!(map, EventBody, "a watch event", |map| {
    let mut ty: Option<EventType> = None;
    let mut object: Option<EventObject> = None;
    while let Some(key) = map.next_key::<EventField>()? {
        match key {
            EventField::Type if ty.is_some() => {
                return Err(de::Error::duplicate_field("type"));
            }
            EventField::Type => {
                let name: Str<'de> = map.next_value()?;
                ty = Some(EventType::parse(&name.0)?);
            }
            EventField::Object if object.is_some() => {
                return Err(de::Error::duplicate_field("object"));
            }
            EventField::Object => {
                object = Some(match ty {
                    Some(ty) => EventObject::Decoded(Box::new(map.next_value_seed(ty)?)),
                    None => EventObject::Pending(map.next_value()?),
                });
            }
            EventField::Other => skip(&mut map)?,
        }
    }
    let ty = ty.ok_or_else(|| de::Error::missing_field("type"))?;
    match object {
        Some(EventObject::Decoded(event)) => Ok(EventBody(*event)),
        Some(EventObject::Pending(value)) => ty
            .deserialize(value)
            .map(EventBody)
            .map_err(de::Error::custom),
        None => Err(de::Error::missing_field("object")),
    }
});

/// Decodes an event's `object` by its type.
impl<'de> DeserializeSeed<'de> for EventType {
    type Value = WatchEvent;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<WatchEvent, D::Error> {
        let watched = |pod: LeanPod<'_>| WatchedPod {
            facts: pod.facts,
            resource_version: pod.resource_version.map(Cow::into_owned),
        };
        Ok(match self {
            Self::Added => WatchEvent::Added(watched(LeanPod::deserialize(d)?)),
            Self::Modified => WatchEvent::Modified(watched(LeanPod::deserialize(d)?)),
            Self::Deleted => WatchEvent::Deleted(watched(LeanPod::deserialize(d)?)),
            Self::Bookmark => WatchEvent::Bookmark {
                resource_version: BookmarkObject::deserialize(d)?.metadata.resource_version,
            },
            Self::Error => {
                let status = StatusObject::deserialize(d)?;
                WatchEvent::Error(WatchStatus {
                    code: status.code,
                    reason: status.reason,
                    message: status.message,
                })
            }
        })
    }
}

/// A bookmark's object: only `metadata.resourceVersion` matters (and is required).
#[derive(Deserialize)]
struct BookmarkObject {
    metadata: BookmarkMeta,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct BookmarkMeta {
    resource_version: String,
}

/// The `Status` of an error event, as kube's `Status` reads it.
#[derive(Deserialize)]
struct StatusObject {
    #[serde(default)]
    code: u16,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    message: String,
}
