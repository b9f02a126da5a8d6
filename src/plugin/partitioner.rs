//! The partitioner runtime: one instance of a `partitioner` component, called once per
//! record.

use std::time::Instant;

use wasmtime::component::InstancePre;
use wasmtime::Store;

use super::instance::{Bindings, Instance, World};
use super::sandbox::StoreState;
use super::PluginError;
use crate::metrics::PluginCalls;

mod bindings {
    wasmtime::component::bindgen!({
        path: "wit",
        world: "partitioner",
        exports: { default: async },
    });
}

impl Bindings<StoreState> for bindings::Partitioner {
    type Pre = bindings::PartitionerPre<StoreState>;
    const WORLD: &'static str = "partitioner";

    fn pre(pre: InstancePre<StoreState>) -> wasmtime::Result<Self::Pre> {
        bindings::PartitionerPre::new(pre)
    }

    async fn instantiate(pre: &Self::Pre, store: &mut Store<StoreState>) -> wasmtime::Result<Self> {
        pre.instantiate_async(store).await
    }
}

impl World for bindings::Partitioner {
    const EXPORT: &'static str = "weir:plugin/partition";

    async fn open(
        &self,
        store: &mut Store<StoreState>,
        config: &Vec<(String, String)>,
    ) -> wasmtime::Result<Result<(), String>> {
        let opened = self
            .weir_plugin_partition()
            .call_open(store, config)
            .await?;
        Ok(opened.map_err(|e| e.message))
    }
}

/// A loaded partitioner plugin (world `partitioner`): chooses a record's partition.
///
/// Owns one instance; a call that traps, times out or runs out of memory fails alone and
/// the instance is replaced (and re-opened with the same config) before the next call.
/// Calls take `&mut self`: use one `Partitioner` per concurrent user.
pub struct Partitioner {
    instance: Instance<bindings::Partitioner>,
    /// `partition` durations and failures.
    calls: PluginCalls,
}

impl Partitioner {
    /// The runtime around a loaded instance (`PluginHost::load_partitioner*`).
    pub(super) fn new(instance: Instance<bindings::Partitioner>) -> Self {
        Partitioner {
            calls: instance.calls("partition"),
            instance,
        }
    }

    /// The plugin's name (its file name).
    pub fn name(&self) -> &str {
        self.instance.name()
    }

    /// The partition in `[0, partition_count)` the plugin chooses for a record.
    ///
    /// Errors: [`PluginError::InvalidCall`] for `partition_count == 0`;
    /// [`PluginError::BadOutput`] for a partition out of range; [`PluginError::Timeout`],
    /// [`PluginError::MemoryLimit`] or [`PluginError::Trap`] when the guest fails (the
    /// instance is then replaced; if that fails too, its error is logged and the next call
    /// tries again).
    pub async fn partition(
        &mut self,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        partition_count: u32,
    ) -> Result<u32, PluginError> {
        let started = Instant::now();
        let result = self.partition_once(key, value, partition_count).await;
        self.calls.record(started.elapsed(), result.is_err());
        result
    }

    /// [`Partitioner::partition`], untimed.
    async fn partition_once(
        &mut self,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        partition_count: u32,
    ) -> Result<u32, PluginError> {
        if partition_count == 0 {
            return Err(PluginError::InvalidCall {
                plugin: self.name().to_string(),
                message: "partition count is 0".into(),
            });
        }
        let (store, world) = self.instance.ready().await?;
        let result = world
            .weir_plugin_partition()
            .call_partition(&mut *store, key, value, partition_count)
            .await;
        match result {
            Ok(p) if p < partition_count => Ok(p),
            Ok(p) => Err(PluginError::BadOutput {
                plugin: self.name().to_string(),
                message: format!("partition {p} for a topic of {partition_count} partitions"),
            }),
            Err(e) => Err(self.instance.failed(&e).await),
        }
    }
}
