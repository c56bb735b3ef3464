//! Lean decoding of the pod JSON the API server sends: a LIST page or a watch event line
//! straight into [`PodFacts`], without building k8s-openapi `Pod`s first.
//!
//! A pod as a LIST returns it is 3.5 to 5 KB of JSON (managedFields, containers with env
//! and probes, volumes, container statuses), and tgsync reads a dozen of its fields.
//! Deserializing whole `Pod`s and dropping them costs several seconds per 100,000 pods
//! (`benches/decode.rs`: 3.2 to 4.2 s for pods of 4.5 KB on two shared cores). This
//! visits only the fields [`PodFacts::take_from`] reads, borrows strings it compares
//! from the input, and lets serde_json skip everything else without allocating: 0.5 to
//! 0.7 s there, not far above serde_json reading the same bytes and keeping nothing.
//!
//! Pure: no client in scope, bytes in, facts out. The rules are those of
//! [`PodFacts::take_from`], field for field, including how k8s-openapi decodes: a field
//! given twice takes its last value, `null` is the same as absent, a missing required
//! field is its default. The unit tests check both paths agree on every fixture and on
//! generated pods. Unlike k8s-openapi, fields tgsync does not read are skipped without
//! being validated (a malformed `creationTimestamp` does not make a pod unreadable).
//!
//! The readers are split by what they read: `list` a LIST page, `pod` one pod and
//! `event` a watch event line; the building blocks they share are here.

use std::borrow::Cow;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, Unexpected, Visitor};
use thiserror::Error;

use crate::core::PodFacts;

/// One page of a pod LIST: the pods, and the list metadata the pager needs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodListPage {
    /// The page's pods, in the order the API server sent them.
    pub pods: Vec<PodFacts>,
    /// `metadata.resourceVersion`: the version the whole list is consistent at; a watch
    /// started from it misses no change.
    pub resource_version: Option<String>,
    /// `metadata.continue`: the token for the next page (absent or empty on the last).
    pub continue_token: Option<String>,
    /// `metadata.remainingItemCount`: how many pods the server says are still to come;
    /// with no continue token it means the list was cut short.
    pub remaining_item_count: Option<i64>,
}

pub use crate::pods::{WatchEvent, WatchStatus, WatchedPod};

/// Why a body could not be decoded, with serde's message and the line and column.
#[derive(Debug, Error)]
pub enum DecodeError {
    /// A LIST page is not a PodList (truncated, wrong types, no `items`).
    #[error("page {page} of the pod list is not a PodList tgsync can read: {source}")]
    ListPage {
        /// Page number, from 1.
        page: usize,
        /// serde_json's error, with line and column.
        #[source]
        source: serde_json::Error,
    },
    /// A LIST page is not UTF-8.
    #[error("page {page} of the pod list is not UTF-8 (invalid byte at offset {offset})")]
    ListPageUtf8 {
        /// Page number, from 1.
        page: usize,
        /// Byte offset of the first invalid byte.
        offset: usize,
    },
    /// A watch event line is not a pod watch event.
    #[error("pod watch event is not one tgsync can read: {source}")]
    WatchEvent {
        /// serde_json's error, with line and column.
        #[source]
        source: serde_json::Error,
    },
    /// A watch event line is not UTF-8.
    #[error("pod watch event is not UTF-8 (invalid byte at offset {offset})")]
    WatchEventUtf8 {
        /// Byte offset of the first invalid byte.
        offset: usize,
    },
}

impl DecodeError {
    /// Line (from 1) where JSON decoding failed; `None` for a UTF-8 error.
    pub fn line(&self) -> Option<usize> {
        match self {
            Self::ListPage { source, .. } | Self::WatchEvent { source } => Some(source.line()),
            Self::ListPageUtf8 { .. } | Self::WatchEventUtf8 { .. } => None,
        }
    }

    /// Column (from 1) where JSON decoding failed; `None` for a UTF-8 error.
    pub fn column(&self) -> Option<usize> {
        match self {
            Self::ListPage { source, .. } | Self::WatchEvent { source } => Some(source.column()),
            Self::ListPageUtf8 { .. } | Self::WatchEventUtf8 { .. } => None,
        }
    }
}

/// Decodes page `page` (from 1, for error messages) of a pod LIST.
///
/// The body must be UTF-8, like the `String` kube made of it before. A page without
/// `items` is an error, never an empty page: "no pods" would deregister every target.
pub fn decode_pod_list(page: usize, body: &[u8]) -> Result<PodListPage, DecodeError> {
    let text = std::str::from_utf8(body).map_err(|e| DecodeError::ListPageUtf8 {
        page,
        offset: e.valid_up_to(),
    })?;
    serde_json::from_str::<PageBody>(text)
        .map(|p| p.0)
        .map_err(|source| DecodeError::ListPage { page, source })
}

/// Decodes one line of a pod watch (`?watch=1`), for the watch loop to apply.
pub fn decode_watch_event(line: &[u8]) -> Result<WatchEvent, DecodeError> {
    let text = std::str::from_utf8(line).map_err(|e| DecodeError::WatchEventUtf8 {
        offset: e.valid_up_to(),
    })?;
    serde_json::from_str::<EventBody>(text)
        .map(|e| e.0)
        .map_err(|source| DecodeError::WatchEvent { source })
}

// ---------------------------------------------------------------------------------------
// Building blocks.

/// Field names of one object, matched once; `Other` is skipped. Like k8s-openapi's own
/// field enums, so keys written with escapes match too.
macro_rules! fields {
    ($name:ident { $($key:literal => $variant:ident),+ $(,)? }) => {
        enum $name {
            $($variant,)+
            Other,
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct FieldVisitor;
                impl Visitor<'_> for FieldVisitor {
                    type Value = $name;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str("a field name")
                    }
                    fn visit_str<E: de::Error>(self, v: &str) -> Result<$name, E> {
                        Ok(match v {
                            $($key => $name::$variant,)+
                            _ => $name::Other,
                        })
                    }
                }
                d.deserialize_identifier(FieldVisitor)
            }
        }
    };
}

/// `impl Deserialize for $ty` by a visitor that reads one map (or one sequence) with
/// `$body`: the serde boilerplate every hand-written reader below would repeat.
macro_rules! deserialize_from {
    (map, $ty:ty, $expecting:literal, |$map:ident| $body:block) => {
        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct MapVisitor;
                impl<'de> Visitor<'de> for MapVisitor {
                    type Value = $ty;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str($expecting)
                    }
                    fn visit_map<A: MapAccess<'de>>(self, mut $map: A) -> Result<$ty, A::Error> {
                        $body
                    }
                }
                d.deserialize_map(MapVisitor)
            }
        }
    };
    (seq, $ty:ty, $expecting:literal, |$seq:ident| $body:block) => {
        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct SeqVisitor;
                impl<'de> Visitor<'de> for SeqVisitor {
                    type Value = $ty;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str($expecting)
                    }
                    fn visit_seq<A: SeqAccess<'de>>(self, mut $seq: A) -> Result<$ty, A::Error> {
                        $body
                    }
                }
                d.deserialize_seq(SeqVisitor)
            }
        }
    };
}

/// A string borrowed from the input when it has no escapes (serde's own `Cow<str>`
/// always copies), for values that are compared rather than kept.
struct Str<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Str<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct StrVisitor;
        impl<'de> Visitor<'de> for StrVisitor {
            type Value = Str<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Str(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Str(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(Str(Cow::Owned(v)))
            }
        }
        d.deserialize_str(StrVisitor)
    }
}

/// Skips the value of the current key.
fn skip<'de, A: MapAccess<'de>>(map: &mut A) -> Result<(), A::Error> {
    map.next_value::<IgnoredAny>().map(drop)
}

/// Checks a pod's `apiVersion` / `kind`, as k8s-openapi does when they are present.
fn expect_str<'de, A: MapAccess<'de>>(map: &mut A, expected: &'static str) -> Result<(), A::Error> {
    let value: Str<'de> = map.next_value()?;
    if value.0 == expected {
        Ok(())
    } else {
        Err(de::Error::invalid_value(
            Unexpected::Str(&value.0),
            &expected,
        ))
    }
}

// The readers, declared after the macros above so they can use them.
mod container;
mod event;
mod list;
mod pod;

use event::EventBody;
use list::PageBody;

#[cfg(test)]
mod tests;
