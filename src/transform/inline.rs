//! Inline transforms: the registry the produce path consults, topic → the transform applied
//! to produced batches before they are appended.
//!
//! The transform manager (`super`) fills it when a transform with `mode = inline` is
//! deployed, replaced (hot reload) or deleted; `protocol::produce` reads it once per
//! partition of every Produce request (an uncontended read lock and a hash look-up).
//!
//! Holds slots only, nothing that leads back to the broker's owners: the produce path
//! passes its own `ingest` to the dead-letter writer, so the registry (shared by the
//! protocol layer, the manager and the admin API) closes no reference cycle.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use super::{Stats, Tolerance};
use crate::plugin::Transform;

/// One inline deployment as the produce path sees it.
pub struct InlineSlot {
    /// Deployment name.
    pub name: String,
    /// Content hash (sha256, hex) of the component in use.
    pub version: String,
    /// The instance; produce calls on the topic take turns.
    pub transform: tokio::sync::Mutex<Transform>,
    /// `errors.tolerance`.
    pub tolerance: Tolerance,
    /// `errors.deadletterqueue.topic.name` (`None`: failing records are only counted).
    pub dlq_topic: Option<String>,
    /// Counters shown by `weir transform list`.
    pub stats: Arc<Stats>,
}

impl std::fmt::Debug for InlineSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InlineSlot")
            .field("name", &self.name)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

/// Input topic → its inline transform. At most one inline transform per topic.
#[derive(Debug, Default)]
pub struct InlineRegistry {
    by_topic: RwLock<HashMap<String, Arc<InlineSlot>>>,
}

impl InlineRegistry {
    /// An empty registry.
    pub fn new() -> InlineRegistry {
        InlineRegistry::default()
    }

    /// The inline transform of `topic`, if any.
    pub fn get(&self, topic: &str) -> Option<Arc<InlineSlot>> {
        let map = self.by_topic.read().unwrap_or_else(|e| e.into_inner());
        if map.is_empty() {
            return None;
        }
        map.get(topic).cloned()
    }

    /// Installs (or replaces) the inline transform of `topic`; returns the previous one.
    pub fn set(&self, topic: &str, slot: Arc<InlineSlot>) -> Option<Arc<InlineSlot>> {
        let mut map = self.by_topic.write().unwrap_or_else(|e| e.into_inner());
        map.insert(topic.to_string(), slot)
    }

    /// Removes the inline transform of `topic`; returns it.
    pub fn remove(&self, topic: &str) -> Option<Arc<InlineSlot>> {
        let mut map = self.by_topic.write().unwrap_or_else(|e| e.into_inner());
        map.remove(topic)
    }
}
