//! Compiled components, cached in memory and (optionally) on disk, keyed by the SHA-256
//! of the `.wasm` bytes.
//!
//! On disk: `<cache_dir>/<sha256 hex>.cwasm`, written to a temporary file and renamed, so
//! a crash never leaves a half-written entry under the final name. An entry wasmtime
//! refuses (another wasmtime version or engine configuration) is recompiled and
//! replaced.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;

use sha2::{Digest, Sha256};
use wasmtime::component::Component;

use super::PluginError;

/// Magic bytes of every WebAssembly binary.
const WASM_MAGIC: &[u8; 4] = b"\0asm";

/// Version field of a core module (a component's is `0d 00 01 00`).
const CORE_MODULE_VERSION: &[u8; 4] = &[1, 0, 0, 0];

/// Most compiled components kept in memory; past it the map is cleared (a broker loads a
/// handful; this bounds a reload loop).
const MAX_CACHED_COMPONENTS: usize = 256;

pub(crate) struct ComponentCache {
    dir: Option<PathBuf>,
    memory: Mutex<HashMap<[u8; 32], Component>>,
}

impl ComponentCache {
    pub(crate) fn new(dir: Option<PathBuf>) -> Result<Self, PluginError> {
        if let Some(d) = &dir {
            std::fs::create_dir_all(d).map_err(|e| PluginError::Host {
                message: format!("creating the plugin cache directory {}: {e}", d.display()),
            })?;
        }
        Ok(ComponentCache {
            dir,
            memory: Mutex::new(HashMap::new()),
        })
    }

    /// The compiled component for `bytes`, from memory, disk, or a fresh compile.
    pub(crate) fn get(
        &self,
        engine: &wasmtime::Engine,
        plugin: &str,
        bytes: &[u8],
    ) -> Result<Component, PluginError> {
        if bytes.get(..4) != Some(WASM_MAGIC) {
            return Err(PluginError::NotWasm {
                plugin: plugin.to_string(),
            });
        }
        if bytes.get(4..8) == Some(CORE_MODULE_VERSION) {
            return Err(PluginError::NotComponent {
                plugin: plugin.to_string(),
            });
        }
        let key: [u8; 32] = Sha256::digest(bytes).into();
        if let Some(c) = self.lock().get(&key) {
            return Ok(c.clone());
        }
        let component = match self.load_from_disk(engine, plugin, &key) {
            Some(c) => c,
            None => {
                let c = Component::new(engine, bytes).map_err(|e| PluginError::Compile {
                    plugin: plugin.to_string(),
                    message: format!("{e:#}"),
                })?;
                self.store_on_disk(plugin, &key, &c);
                c
            }
        };
        let mut memory = self.lock();
        if memory.len() >= MAX_CACHED_COMPONENTS {
            memory.clear();
        }
        memory.insert(key, component.clone());
        Ok(component)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], Component>> {
        match self.memory.lock() {
            Ok(m) => m,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    fn path(&self, key: &[u8; 32]) -> Option<PathBuf> {
        let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
        self.dir.as_ref().map(|d| d.join(format!("{hex}.cwasm")))
    }

    #[allow(unsafe_code)]
    fn load_from_disk(
        &self,
        engine: &wasmtime::Engine,
        plugin: &str,
        key: &[u8; 32],
    ) -> Option<Component> {
        let path = self.path(key)?;
        let bytes = std::fs::read(&path).ok()?;
        // SAFETY: `Component::deserialize` runs the bytes as native code. They were written
        // by `store_on_disk` below (`Component::serialize` of this engine's compile) into
        // the cache directory, which only weir writes (documented on
        // `PluginHostConfig::cache_dir`); wasmtime checks the header for its version and
        // engine configuration and refuses a mismatch, which recompiles.
        match unsafe { Component::deserialize(engine, &bytes) } {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::warn!(plugin, path = %path.display(), "cached component refused, recompiling: {e:#}");
                None
            }
        }
    }

    fn store_on_disk(&self, plugin: &str, key: &[u8; 32], component: &Component) {
        let Some(path) = self.path(key) else { return };
        let result = component
            .serialize()
            .map_err(|e| format!("{e:#}"))
            .and_then(|bytes| {
                let tmp = path.with_extension(format!("tmp{}", std::process::id()));
                std::fs::write(&tmp, bytes)
                    .and_then(|()| std::fs::rename(&tmp, &path))
                    .map_err(|e| e.to_string())
            });
        if let Err(e) = result {
            // The cache is an optimisation: a failure costs a compile next time, no more.
            tracing::warn!(plugin, path = %path.display(), "cannot cache compiled component: {e}");
        }
    }
}
