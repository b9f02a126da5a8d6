//! weir plugin SDK: write a weir partitioner or transform as a plain Rust function (or a
//! type holding config) plus one export line.
//!
//! ```ignore
//! // A partitioner: key, value, partition count -> partition.
//! fn first_byte(key: Option<&[u8]>, _value: Option<&[u8]>, partition_count: u32) -> u32 {
//!     key.and_then(|k| k.first()).map_or(0, |b| u32::from(*b) % partition_count)
//! }
//! weir_plugin_sdk::export_partitioner!(fn first_byte);
//!
//! // A transform: each input record -> zero or more output records.
//! fn identity(record: &Record<'_>, out: &mut Output) -> Result<(), String> {
//!     out.emit(record);
//!     Ok(())
//! }
//! weir_plugin_sdk::export_transform!(fn identity);
//! ```
//!
//! A plugin that needs its config implements [`Partitioner`] or [`Transform`] and exports
//! the type: `export_transform!(Redact);`. `open` runs once per instance with the config.
//!
//! The transform batch crosses the host/guest boundary as one byte buffer in the "weir
//! batch v1" layout documented in `wit/transform.wit`; [`Record`] reads it without
//! copying and [`Output`] writes it, so a plugin never sees the layout.
//!
//! Build with `cargo build --release --target wasm32-wasip2`; the `.wasm` in
//! `target/wasm32-wasip2/release/` is the component weir loads.

// The generated bindings and the export macros name this crate by its path.
extern crate self as weir_plugin_sdk;

mod batch;
pub mod json;
pub mod murmur2;
pub mod select;
pub mod testing;

pub use batch::{Header, Headers, MalformedBatch, NewRecord, Output, Record};

/// Bindings of the `partitioner` world (generated; use [`export_partitioner!`]).
#[doc(hidden)]
pub mod partitioner_bindings {
    wit_bindgen::generate!({
        world: "partitioner",
        path: "../../wit",
        pub_export_macro: true,
        export_macro_name: "__export_partitioner_world",
        default_bindings_module: "weir_plugin_sdk::partitioner_bindings",
        runtime_path: "weir_plugin_sdk::__private::wit_bindgen::rt",
    });
}

/// Bindings of the `transform` world (generated; use [`export_transform!`]).
#[doc(hidden)]
pub mod transform_bindings {
    wit_bindgen::generate!({
        world: "transform",
        path: "../../wit",
        pub_export_macro: true,
        export_macro_name: "__export_transform_world",
        default_bindings_module: "weir_plugin_sdk::transform_bindings",
        runtime_path: "weir_plugin_sdk::__private::wit_bindgen::rt",
    });
}

/// A plugin's configuration: the key/value pairs of its deployment, in order.
#[derive(Debug, Clone, Default)]
pub struct Config {
    pairs: Vec<(String, String)>,
}

impl Config {
    /// Wraps the pairs the host passed to `open`.
    pub fn new(pairs: Vec<(String, String)>) -> Self {
        Config { pairs }
    }

    /// The value of the last pair named `key`, if any.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Every pair, in the order given.
    pub fn pairs(&self) -> &[(String, String)] {
        &self.pairs
    }
}

/// Where a batch comes from (the WIT `batch-context`).
#[derive(Debug, Clone, Copy)]
pub struct BatchContext<'a> {
    /// Input topic.
    pub topic: &'a str,
    /// Input partition.
    pub partition: i32,
    /// Offset of the batch's first record, or -1 when the records have no offsets yet.
    pub base_offset: i64,
}

/// A partitioner with state built from its config. For a stateless one, export a plain
/// function instead: `export_partitioner!(fn my_partition)`.
pub trait Partitioner: Sized + 'static {
    /// Builds the partitioner from its config; an error refuses the plugin at load.
    fn open(config: &Config) -> Result<Self, String>;

    /// The partition in `[0, partition_count)` (`partition_count >= 1`) for a record.
    fn partition(&mut self, key: Option<&[u8]>, value: Option<&[u8]>, partition_count: u32) -> u32;
}

/// A transform with state built from its config. For a stateless one, export a plain
/// function instead: `export_transform!(fn my_transform)`.
pub trait Transform: Sized + 'static {
    /// Builds the transform from its config; an error refuses the plugin at load.
    fn open(config: &Config) -> Result<Self, String>;

    /// Called before the records of each batch; the default does nothing.
    fn begin_batch(&mut self, _context: &BatchContext<'_>) {}

    /// Handles one input record: emit nothing (drop it), one record or several into
    /// `out`. An error fails the batch, naming this record.
    fn apply(&mut self, record: &Record<'_>, out: &mut Output) -> Result<(), String>;
}

/// Runs `t` over one input batch (the "weir batch v1" input layout): `begin_batch`, then
/// `apply` per record. Returns the output layout, or the offending record's index (when
/// one is to blame) and the message.
pub(crate) fn apply_batch<T: Transform>(
    t: &mut T,
    context: &BatchContext<'_>,
    input: &[u8],
) -> Result<Vec<u8>, (Option<u32>, String)> {
    t.begin_batch(context);
    let records = batch::Input::parse(input).map_err(|e| (Some(e.record_index), e.to_string()))?;
    // An out-record is its in-record plus 8 bytes (input index, topic length): room for one
    // output per input without growing.
    let mut out = Output::with_capacity(
        input
            .len()
            .saturating_add((records.remaining() as usize).saturating_mul(8)),
    );
    for record in records {
        let record = record.map_err(|e| (Some(e.record_index), e.to_string()))?;
        out.set_input_index(record.index());
        t.apply(&record, &mut out)
            .map_err(|message| (Some(record.index()), message))?;
    }
    Ok(out.finish())
}

/// Support code for the export macros; not a stable API.
#[doc(hidden)]
pub mod __private {
    use std::cell::RefCell;
    use std::thread::LocalKey;

    pub use wit_bindgen;

    use super::{BatchContext, Config, Partitioner, Transform};
    use crate::partitioner_bindings::weir::plugin::types::PluginError as PError;
    use crate::transform_bindings::weir::plugin::types::{
        BatchContext as WitContext, PluginError as TError,
    };

    /// `open` of the partitioner world for `P`.
    pub fn partitioner_open<P: Partitioner>(
        state: &'static LocalKey<RefCell<Option<P>>>,
        config: Vec<(String, String)>,
    ) -> Result<(), PError> {
        let p = P::open(&Config::new(config)).map_err(|message| PError {
            message,
            record_index: None,
        })?;
        state.with(|s| *s.borrow_mut() = Some(p));
        Ok(())
    }

    /// `partition` of the partitioner world for `P`. Traps (a bug the host reports) when
    /// called before `open`.
    pub fn partitioner_partition<P: Partitioner>(
        state: &'static LocalKey<RefCell<Option<P>>>,
        key: Option<Vec<u8>>,
        value: Option<Vec<u8>>,
        partition_count: u32,
    ) -> u32 {
        state.with(|s| match s.borrow_mut().as_mut() {
            Some(p) => p.partition(key.as_deref(), value.as_deref(), partition_count),
            None => panic!("weir: partition called before open"),
        })
    }

    /// `open` of the transform world for `T`.
    pub fn transform_open<T: Transform>(
        state: &'static LocalKey<RefCell<Option<T>>>,
        config: Vec<(String, String)>,
    ) -> Result<(), TError> {
        let t = T::open(&Config::new(config)).map_err(|message| TError {
            message,
            record_index: None,
        })?;
        state.with(|s| *s.borrow_mut() = Some(t));
        Ok(())
    }

    /// `apply` of the transform world for `T`: parses the input layout, calls `T::apply`
    /// per record, returns the output layout.
    pub fn transform_apply<T: Transform>(
        state: &'static LocalKey<RefCell<Option<T>>>,
        context: WitContext,
        input: Vec<u8>,
    ) -> Result<Vec<u8>, TError> {
        state.with(|s| {
            let mut guard = s.borrow_mut();
            let Some(t) = guard.as_mut() else {
                return Err(TError {
                    message: "apply called before open".into(),
                    record_index: None,
                });
            };
            let context = BatchContext {
                topic: &context.topic,
                partition: context.partition,
                base_offset: context.base_offset,
            };
            crate::apply_batch(t, &context, &input).map_err(|(record_index, message)| TError {
                message,
                record_index,
            })
        })
    }
}

/// Exports a partitioner: `export_partitioner!(fn name)` for a plain function
/// `fn(key: Option<&[u8]>, value: Option<&[u8]>, partition_count: u32) -> u32`, or
/// `export_partitioner!(Type)` for a type implementing [`Partitioner`]. Once per crate.
#[macro_export]
macro_rules! export_partitioner {
    (fn $f:path) => {
        // Checks the signature, and keeps a native build (unit tests) from calling the
        // function unused.
        const _: fn(Option<&[u8]>, Option<&[u8]>, u32) -> u32 = $f;
        struct __WeirFnPartitioner;
        impl $crate::Partitioner for __WeirFnPartitioner {
            fn open(_config: &$crate::Config) -> ::core::result::Result<Self, String> {
                Ok(__WeirFnPartitioner)
            }
            fn partition(&mut self, key: Option<&[u8]>, value: Option<&[u8]>, n: u32) -> u32 {
                $f(key, value, n)
            }
        }
        $crate::export_partitioner!(__WeirFnPartitioner);
    };
    ($t:ty) => {
        ::std::thread_local! {
            static __WEIR_PARTITIONER: ::core::cell::RefCell<Option<$t>> =
                const { ::core::cell::RefCell::new(None) };
        }
        #[allow(dead_code)]
        struct __WeirPartitionerExport;
        impl $crate::partitioner_bindings::exports::weir::plugin::partition::Guest for __WeirPartitionerExport {
            fn open(
                config: ::std::vec::Vec<(String, String)>,
            ) -> ::core::result::Result<(), $crate::partitioner_bindings::weir::plugin::types::PluginError> {
                $crate::__private::partitioner_open::<$t>(&__WEIR_PARTITIONER, config)
            }
            fn partition(key: Option<Vec<u8>>, value: Option<Vec<u8>>, partition_count: u32) -> u32 {
                $crate::__private::partitioner_partition::<$t>(
                    &__WEIR_PARTITIONER, key, value, partition_count,
                )
            }
        }
        // Only a wasm build exports: the export names (`weir:plugin/...#open`) are not
        // valid native symbol names, and a native build (unit tests) needs no exports.
        #[cfg(target_arch = "wasm32")]
        $crate::partitioner_bindings::__export_partitioner_world!(
            __WeirPartitionerExport with_types_in $crate::partitioner_bindings
        );
    };
}

/// Exports a transform: `export_transform!(fn name)` for a plain function
/// `fn(&Record<'_>, &mut Output) -> Result<(), String>`, or `export_transform!(Type)` for a
/// type implementing [`Transform`]. Once per crate.
#[macro_export]
macro_rules! export_transform {
    (fn $f:path) => {
        // Checks the signature, and keeps a native build (unit tests) from calling the
        // function unused.
        const _: fn(&$crate::Record<'_>, &mut $crate::Output) -> ::core::result::Result<(), String> = $f;
        struct __WeirFnTransform;
        impl $crate::Transform for __WeirFnTransform {
            fn open(_config: &$crate::Config) -> ::core::result::Result<Self, String> {
                Ok(__WeirFnTransform)
            }
            fn apply(
                &mut self,
                record: &$crate::Record<'_>,
                out: &mut $crate::Output,
            ) -> ::core::result::Result<(), String> {
                $f(record, out)
            }
        }
        $crate::export_transform!(__WeirFnTransform);
    };
    ($t:ty) => {
        ::std::thread_local! {
            static __WEIR_TRANSFORM: ::core::cell::RefCell<Option<$t>> =
                const { ::core::cell::RefCell::new(None) };
        }
        #[allow(dead_code)]
        struct __WeirTransformExport;
        impl $crate::transform_bindings::exports::weir::plugin::transformer::Guest for __WeirTransformExport {
            fn open(
                config: ::std::vec::Vec<(String, String)>,
            ) -> ::core::result::Result<(), $crate::transform_bindings::weir::plugin::types::PluginError> {
                $crate::__private::transform_open::<$t>(&__WEIR_TRANSFORM, config)
            }
            fn apply(
                context: $crate::transform_bindings::weir::plugin::types::BatchContext,
                input: ::std::vec::Vec<u8>,
            ) -> ::core::result::Result<
                ::std::vec::Vec<u8>,
                $crate::transform_bindings::weir::plugin::types::PluginError,
            > {
                $crate::__private::transform_apply::<$t>(&__WEIR_TRANSFORM, context, input)
            }
        }
        // Only a wasm build exports: the export names (`weir:plugin/...#open`) are not
        // valid native symbol names, and a native build (unit tests) needs no exports.
        #[cfg(target_arch = "wasm32")]
        $crate::transform_bindings::__export_transform_world!(
            __WeirTransformExport with_types_in $crate::transform_bindings
        );
    };
}
