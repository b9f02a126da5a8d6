//! The partitioner runtime: one instance of a `partitioner` component, called once per
//! record.

use std::sync::Arc;

use wasmtime::component::{Component, Linker};
use wasmtime::Store;

use super::sandbox::StoreState;
use super::{call_error, PluginError, Shared};

mod bindings {
    wasmtime::component::bindgen!({
        path: "wit",
        world: "partitioner",
        exports: { default: async },
    });
}

use bindings::{Partitioner as World, PartitionerPre as WorldPre};

/// A loaded partitioner plugin (world `partitioner`): chooses a record's partition.
///
/// Owns one instance; a call that traps, times out or runs out of memory fails alone and
/// the instance is replaced (and re-opened with the same config) before the next call.
/// Calls take `&mut self`: use one `Partitioner` per concurrent user.
pub struct Partitioner {
    shared: Arc<Shared>,
    name: Arc<str>,
    pre: WorldPre<StoreState>,
    config: Vec<(String, String)>,
    live: Option<(Store<StoreState>, World)>,
}

impl Partitioner {
    pub(super) async fn load(
        shared: Arc<Shared>,
        name: Arc<str>,
        component: &Component,
        config: Vec<(String, String)>,
    ) -> Result<Self, PluginError> {
        let wrong_world = |e: wasmtime::Error| PluginError::WrongWorld {
            plugin: name.to_string(),
            world: "partitioner",
            message: format!("{e:#}"),
        };
        let mut linker = Linker::new(&shared.engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).map_err(|e| PluginError::Host {
            message: format!("linking WASI: {e:#}"),
        })?;
        let pre = linker.instantiate_pre(component).map_err(wrong_world)?;
        let pre = WorldPre::new(pre).map_err(wrong_world)?;
        let mut p = Partitioner {
            shared,
            name,
            pre,
            config,
            live: None,
        };
        p.instantiate().await?;
        Ok(p)
    }

    /// The plugin's name (its file name).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A fresh store and instance, opened with the config.
    async fn instantiate(&mut self) -> Result<(), PluginError> {
        self.live = None;
        let mut store = Store::new(
            &self.shared.engine,
            StoreState::new(&self.name, &self.shared.limits),
        );
        StoreState::limit(&mut store);
        store.epoch_deadline_trap();
        store.set_epoch_deadline(self.shared.deadline_ticks());
        let world = match self.pre.instantiate_async(&mut store).await {
            Ok(w) => w,
            Err(e) => {
                return Err(call_error(
                    &self.name,
                    &self.shared.limits,
                    store.data(),
                    &e,
                ))
            }
        };
        store.set_epoch_deadline(self.shared.deadline_ticks());
        let opened = world
            .weir_plugin_partition()
            .call_open(&mut store, &self.config)
            .await;
        match opened {
            Ok(Ok(())) => {
                self.live = Some((store, world));
                Ok(())
            }
            Ok(Err(e)) => Err(PluginError::Open {
                plugin: self.name.to_string(),
                message: e.message,
            }),
            Err(e) => Err(call_error(
                &self.name,
                &self.shared.limits,
                store.data(),
                &e,
            )),
        }
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
        if partition_count == 0 {
            return Err(PluginError::InvalidCall {
                plugin: self.name.to_string(),
                message: "partition count is 0".into(),
            });
        }
        if self.live.is_none() {
            self.instantiate().await?;
        }
        let deadline = self.shared.deadline_ticks();
        let Some((store, world)) = self.live.as_mut() else {
            return Err(PluginError::Host {
                message: format!("plugin {}: no live instance", self.name),
            });
        };
        store.data_mut().begin_call();
        store.set_epoch_deadline(deadline);
        let result = world
            .weir_plugin_partition()
            .call_partition(&mut *store, key, value, partition_count)
            .await;
        match result {
            Ok(p) if p < partition_count => Ok(p),
            Ok(p) => Err(PluginError::BadOutput {
                plugin: self.name.to_string(),
                message: format!("partition {p} for a topic of {partition_count} partitions"),
            }),
            Err(e) => {
                let err = call_error(&self.name, &self.shared.limits, store.data(), &e);
                if let Err(again) = self.instantiate().await {
                    tracing::warn!(plugin = %self.name, "replacing the failed instance: {again}");
                }
                Err(err)
            }
        }
    }
}
