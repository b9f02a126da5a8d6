//! What the partitioner and transform runtimes share: checking a component against its
//! world at load (with messages that name what is wrong), linking it once
//! (`InstancePre`), and the lifecycle of its one instance — a fresh `Store` with the
//! sandbox and limits, instantiation and `open` under the call deadline, and replacement
//! after a failed call.
//!
//! Generic over the `bindgen!` world through [`World`]; the runtimes keep only their
//! calls (`partition`, `apply`) and what they check in the results. The
//! connector worlds (`connector.rs`) share the rest: [`Bindings`], [`wasi_linker`],
//! [`link`], [`sandboxed_store`] and [`begin_call`].

use std::future::Future;
use std::sync::Arc;

use wasmtime::component::{Component, InstancePre, Linker};
use wasmtime::Store;
use wasmtime_wasi::WasiView;

use super::sandbox::StoreState;
use super::{call_error, PluginError, Shared};
use crate::metrics::PluginCalls;

/// The version of weir's WIT package this host provides.
pub(crate) const PACKAGE_VERSION: &str = "0.1.0";

/// The WASI 0.2 packages weir links (`wasmtime_wasi::p2::add_to_linker_async`), each
/// with no files, sockets or environment granted.
const LINKED_WASI: &[&str] = &[
    "wasi:cli/",
    "wasi:clocks/",
    "wasi:filesystem/",
    "wasi:io/",
    "wasi:random/",
    "wasi:sockets/",
];

/// A `bindgen!` world's bindings for a store holding `T`: how to wrap a linked
/// component and instantiate it. Implemented by each world's `bindgen!` struct.
pub(crate) trait Bindings<T>: Sized + Send + 'static {
    /// The world's `InstancePre` wrapper (`PartitionerPre<StoreState>`, ...).
    type Pre: Send + Sync;
    /// World name for messages (`partitioner`, `transform`, `source-connector`, ...).
    const WORLD: &'static str;

    /// Wraps a linked component, checking its exports' types.
    fn pre(pre: InstancePre<T>) -> wasmtime::Result<Self::Pre>;

    /// Instantiates in `store`.
    fn instantiate(
        pre: &Self::Pre,
        store: &mut Store<T>,
    ) -> impl Future<Output = wasmtime::Result<Self>> + Send;
}

/// A world [`Instance`] loads (partitioner, transform): checked against its export
/// before linking, and opened with its config.
pub(crate) trait World: Bindings<StoreState> {
    /// The interface the world exports, unversioned (`weir:plugin/partition`).
    const EXPORT: &'static str;

    /// Calls the world's `open(config)`: `Ok(Err(message))` is the plugin refusing it.
    #[allow(clippy::ptr_arg)] // `bindgen!` generates `call_open(&Vec<..>)`
    fn open(
        &self,
        store: &mut Store<StoreState>,
        config: &Vec<(String, String)>,
    ) -> impl Future<Output = wasmtime::Result<Result<(), String>>> + Send;
}

/// One loaded plugin: its linked component, its config and (when healthy) its live
/// instance.
pub(crate) struct Instance<W: World> {
    shared: Arc<Shared>,
    name: Arc<str>,
    pre: W::Pre,
    config: Vec<(String, String)>,
    live: Option<(Store<StoreState>, W)>,
}

impl<W: World> Instance<W> {
    /// The one loader of the partitioner and transform worlds: checks `component`
    /// against world `W` ([`check_world`]), links it and makes the first instance
    /// (opened with `config`).
    ///
    /// Errors: [`PluginError::WrongWorld`] naming the import weir withholds, the missing
    /// export or the other version of weir's package; [`PluginError::Open`]; a limit hit
    /// while instantiating or opening.
    pub(crate) async fn load(
        shared: &Arc<Shared>,
        name: Arc<str>,
        component: &Component,
        config: &[(String, String)],
    ) -> Result<Self, PluginError> {
        let (imports, exports) = names(&shared.engine, component);
        check_world(&imports, &exports, W::EXPORT)
            .map_err(|message| wrong_world(&name, W::WORLD, message))?;
        let pre = link::<_, W>(&wasi_linker(&shared.engine)?, component, &name)?;
        let mut instance = Instance {
            shared: shared.clone(),
            name,
            pre,
            config: config.to_vec(),
            live: None,
        };
        instance.instantiate().await?;
        Ok(instance)
    }

    /// The plugin's name (its file name).
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The metric handles of this plugin's calls named `call`.
    pub(crate) fn calls(&self, call: &'static str) -> PluginCalls {
        self.shared.calls(&self.name, call)
    }

    /// A fresh store and instance, opened with the config.
    async fn instantiate(&mut self) -> Result<(), PluginError> {
        self.live = None;
        let mut store = sandboxed_store(
            &self.shared,
            StoreState::new(&self.name, &self.shared.limits),
        );
        let deadline = store.data().deadline().clone();
        let world = match W::instantiate(&self.pre, &mut store).await {
            Ok(w) => w,
            Err(e) => return Err(self.error(&store, &e)),
        };
        deadline.arm(&mut store, self.shared.limits.call_timeout_ms);
        match world.open(&mut store, &self.config).await {
            Ok(Ok(())) => {
                self.live = Some((store, world));
                Ok(())
            }
            Ok(Err(message)) => Err(PluginError::Open {
                plugin: self.name.to_string(),
                message,
            }),
            Err(e) => Err(self.error(&store, &e)),
        }
    }

    fn error(&self, store: &Store<StoreState>, e: &wasmtime::Error) -> PluginError {
        call_error(&self.name, &self.shared.limits, store.data(), e)
    }

    /// The live instance, ready for one call: instantiated again if the last call failed,
    /// the stderr tail cleared and the call deadline set.
    ///
    /// Errors: instantiating or opening a replacement failed.
    pub(crate) async fn ready(&mut self) -> Result<(&mut Store<StoreState>, &W), PluginError> {
        if self.live.is_none() {
            self.instantiate().await?;
        }
        let timeout_ms = self.shared.limits.call_timeout_ms;
        let Some((store, world)) = self.live.as_mut() else {
            return Err(PluginError::Host {
                message: format!("plugin {}: no live instance", self.name),
            });
        };
        begin_call(store, timeout_ms);
        Ok((store, &*world))
    }

    /// The error a failed call (`e`, from the instance [`Instance::ready`] gave) means;
    /// the instance is dropped and replaced (if that fails too, it is logged and the next
    /// call tries again).
    pub(crate) async fn failed(&mut self, e: &wasmtime::Error) -> PluginError {
        let err = match &self.live {
            Some((store, _)) => self.error(store, e),
            None => PluginError::Trap {
                plugin: self.name.to_string(),
                message: format!("{e:#}"),
            },
        };
        if let Err(again) = self.instantiate().await {
            tracing::warn!(plugin = %self.name, "replacing the failed instance: {again}");
        }
        err
    }
}

/// A linker with WASI 0.2 (`wasmtime_wasi::p2::add_to_linker_async`), nothing else yet.
///
/// Errors: [`PluginError::Host`] when WASI cannot be linked.
pub(crate) fn wasi_linker<T: WasiView + 'static>(
    engine: &wasmtime::Engine,
) -> Result<Linker<T>, PluginError> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker).map_err(|e| PluginError::Host {
        message: format!("linking WASI: {e:#}"),
    })?;
    Ok(linker)
}

/// Links `component` with `linker` as world `W` (checking its exports' types).
///
/// Errors: [`PluginError::WrongWorld`] with wasmtime's message.
pub(crate) fn link<T, W: Bindings<T>>(
    linker: &Linker<T>,
    component: &Component,
    plugin: &str,
) -> Result<W::Pre, PluginError> {
    let wrong = |e: wasmtime::Error| wrong_world(plugin, W::WORLD, format!("{e:#}"));
    let pre = linker.instantiate_pre(component).map_err(wrong)?;
    W::pre(pre).map_err(wrong)
}

fn wrong_world(plugin: &str, world: &'static str, message: String) -> PluginError {
    PluginError::WrongWorld {
        plugin: plugin.to_string(),
        world,
        message,
    }
}

/// A store holding `data` (which wraps a [`StoreState`]) with its memory limiter and
/// call deadline installed, the deadline armed for instantiation.
pub(crate) fn sandboxed_store<T: AsMut<StoreState> + Send + 'static>(
    shared: &Shared,
    data: T,
) -> Store<T> {
    let mut store = Store::new(&shared.engine, data);
    store.limiter(|s| s.as_mut().limiter());
    let deadline = store.data_mut().as_mut().deadline().clone();
    deadline.install(&mut store);
    deadline.arm(&mut store, shared.limits.call_timeout_ms);
    store
}

/// Readies `store` for one call: the stderr tail of earlier calls forgotten, the call
/// deadline armed for `timeout_ms`.
pub(crate) fn begin_call<T: AsMut<StoreState>>(store: &mut Store<T>, timeout_ms: u64) {
    let state = store.data_mut().as_mut();
    state.begin_call();
    let deadline = state.deadline().clone();
    deadline.arm(store, timeout_ms);
}

/// The component's import and export names (`wasi:io/streams@0.2.6`,
/// `weir:plugin/partition@0.1.0`, ...).
pub(crate) fn names(
    engine: &wasmtime::Engine,
    component: &Component,
) -> (Vec<String>, Vec<String>) {
    let ty = component.component_type();
    let imports = ty.imports(engine).map(|(n, _)| n.to_string()).collect();
    let exports = ty.exports(engine).map(|(n, _)| n.to_string()).collect();
    (imports, exports)
}

/// The version after `@` in an interface name, if any.
fn version(name: &str) -> Option<&str> {
    name.rsplit_once('@').map(|(_, v)| v)
}

/// Checks a component's imports and exports against a world exporting `export`
/// (unversioned, e.g. `weir:plugin/transformer`) at [`PACKAGE_VERSION`], before linking,
/// so the message says what is wrong in weir's terms rather than the linker's:
///
/// - anything of `weir:plugin` at another version → "built for weir:plugin 1.0.0; this
///   weir provides weir:plugin 0.1.0 (exports: ...)";
/// - a connector (exports `weir:plugin/source` or `sink`) where another world is
///   wanted → "it is a connector: it implements the world `sink-connector` ...";
/// - an import weir does not link (anything but WASI 0.2's cli, clocks, filesystem, io,
///   random, sockets and weir's own `types`) → "imports `weir:host/secrets@0.1.0`, which
///   weir does not provide (...)";
/// - the world's interface not exported → "does not export `weir:plugin/...@0.1.0`
///   (exports: ...)".
///
/// Errors: the message (the caller wraps it in [`PluginError::WrongWorld`]).
pub(crate) fn check_world(
    imports: &[String],
    exports: &[String],
    export: &str,
) -> Result<(), String> {
    let listed = |names: &[String]| {
        if names.is_empty() {
            "none".to_string()
        } else {
            names.join(", ")
        }
    };
    let other_version = imports
        .iter()
        .chain(exports)
        .filter(|n| n.starts_with("weir:plugin/"))
        .find_map(|n| version(n).filter(|v| *v != PACKAGE_VERSION));
    if let Some(v) = other_version {
        return Err(format!(
            "built for weir:plugin {v}; this weir provides weir:plugin {PACKAGE_VERSION} \
             (exports: {})",
            listed(exports)
        ));
    }
    let wanted = format!("{export}@{PACKAGE_VERSION}");
    let connector_world = export.ends_with("/source") || export.ends_with("/sink");
    if !exports.contains(&wanted) && !connector_world {
        // A connector has imports no other world gets: say what it is before naming one.
        for (world, iface) in [("source-connector", "source"), ("sink-connector", "sink")] {
            let connector = format!("weir:plugin/{iface}@{PACKAGE_VERSION}");
            if exports.contains(&connector) {
                return Err(format!(
                    "it is a connector: it implements the world `{world}` (exports \
                     `{connector}`); run it as a connector (`weir connector create`, \
                     POST /connectors or a connect.config.dir file)"
                ));
            }
        }
    }
    let ours = format!("weir:plugin/types@{PACKAGE_VERSION}");
    for name in imports {
        let wasi_02 = LINKED_WASI.iter().any(|p| name.starts_with(p))
            && version(name).is_some_and(|v| v.starts_with("0.2."));
        if !wasi_02 && *name != ours {
            return Err(format!(
                "imports `{name}`, which weir does not provide (weir links WASI 0.2 and \
                 nothing else)"
            ));
        }
    }
    if !exports.contains(&wanted) {
        return Err(format!(
            "does not export `{wanted}` (exports: {})",
            listed(exports)
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check_world;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_plain_partitioner_passes() {
        let imports = names(&["wasi:io/streams@0.2.6", "wasi:cli/stderr@0.2.6"]);
        let exports = names(&["weir:plugin/partition@0.1.0"]);
        check_world(&imports, &exports, "weir:plugin/partition").unwrap();
    }

    #[test]
    fn a_withheld_import_is_named() {
        let imports = names(&["wasi:io/streams@0.2.6", "weir:host/secrets@0.1.0"]);
        let exports = names(&["weir:plugin/transformer@0.1.0"]);
        let e = check_world(&imports, &exports, "weir:plugin/transformer").unwrap_err();
        assert!(
            e.starts_with("imports `weir:host/secrets@0.1.0`, which weir does not provide"),
            "{e}"
        );
        // WASI outside 0.2, or a WASI package weir does not link, is withheld too.
        let imports = names(&["wasi:http/outgoing-handler@0.2.6"]);
        assert!(check_world(&imports, &exports, "weir:plugin/transformer").is_err());
        let imports = names(&["wasi:io/streams@0.3.0"]);
        assert!(check_world(&imports, &exports, "weir:plugin/transformer").is_err());
    }

    #[test]
    fn another_major_version_is_named() {
        let imports = names(&["weir:plugin/types@1.0.0"]);
        let exports = names(&["weir:plugin/transformer@1.0.0"]);
        let e = check_world(&imports, &exports, "weir:plugin/transformer").unwrap_err();
        assert_eq!(
            e,
            "built for weir:plugin 1.0.0; this weir provides weir:plugin 0.1.0 \
             (exports: weir:plugin/transformer@1.0.0)"
        );
    }

    #[test]
    fn a_connector_is_named_as_one() {
        let imports = names(&["weir:plugin/sqlite@0.1.0", "weir:plugin/log@0.1.0"]);
        let exports = names(&["weir:plugin/sink@0.1.0"]);
        let e = check_world(&imports, &exports, "weir:plugin/transformer").unwrap_err();
        assert!(
            e.starts_with(
                "it is a connector: it implements the world `sink-connector` \
                 (exports `weir:plugin/sink@0.1.0`)"
            ),
            "{e}"
        );
    }

    #[test]
    fn the_other_world_is_named() {
        let exports = names(&["weir:plugin/partition@0.1.0"]);
        let e = check_world(&[], &exports, "weir:plugin/transformer").unwrap_err();
        assert_eq!(
            e,
            "does not export `weir:plugin/transformer@0.1.0` (exports: \
             weir:plugin/partition@0.1.0)"
        );
    }
}
