//! The `state` host capability of connectors (`wit/connector.wit`, interface `state`):
//! a small key-value map per connector, kept by whoever implements [`StateStore`] (the
//! connect runtime: `crate::connect::store::ConnectorStates`, over `__connect_state`).
//!
//! Owns: the scoping. A [`StateGrant`] binds one connector name to the store, and the
//! WIT glue (`connector.rs`) only ever calls the store with that name, so a guest
//! cannot name another connector's state.
//!
//! Never does: persist anything itself or know about topics (that is the store's
//! business; `plugin` does not import `connect`).

use std::sync::Arc;

/// Where connector state lives. Implementations check the limits and make a `set`
/// durable before returning ok.
pub trait StateStore: Send + Sync + 'static {
    /// The value of `key` for `connector`, if any.
    fn get(&self, connector: &str, key: &str) -> Option<Vec<u8>>;

    /// Stores (`Some`) or deletes (`None`) `key` for `connector`, durably.
    ///
    /// Errors: a limit exceeded or the write failed, as a message for the guest.
    fn set(&self, connector: &str, key: &str, value: Option<Vec<u8>>) -> Result<(), String>;

    /// Every key of `connector`, sorted.
    fn keys(&self, connector: &str) -> Vec<String>;
}

/// A connector's access to its own state: the store and the connector name that scopes
/// every call.
#[derive(Clone)]
pub struct StateGrant {
    connector: Arc<str>,
    store: Arc<dyn StateStore>,
}

impl StateGrant {
    /// Grants `connector` (its `name` key) its own state in `store`.
    pub fn new(connector: &str, store: Arc<dyn StateStore>) -> Self {
        StateGrant {
            connector: connector.into(),
            store,
        }
    }

    pub(crate) fn get(&self, key: &str) -> Option<Vec<u8>> {
        self.store.get(&self.connector, key)
    }

    pub(crate) fn set(&self, key: &str, value: Option<Vec<u8>>) -> Result<(), String> {
        self.store.set(&self.connector, key, value)
    }

    pub(crate) fn keys(&self) -> Vec<String> {
        self.store.keys(&self.connector)
    }
}

impl std::fmt::Debug for StateGrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateGrant")
            .field("connector", &self.connector)
            .finish_non_exhaustive()
    }
}

/// Two grants are equal when they scope the same connector in the same store.
impl PartialEq for StateGrant {
    fn eq(&self, other: &Self) -> bool {
        self.connector == other.connector && Arc::ptr_eq(&self.store, &other.store)
    }
}

impl Eq for StateGrant {}
