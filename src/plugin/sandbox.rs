//! A plugin instance's store state: the empty WASI context (no ambient capabilities), the
//! memory limiter, and guest stdout/stderr routed to `tracing`.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use wasmtime::component::ResourceTable;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError};
use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use super::PluginLimits;

/// Most table elements an instance may have: far above what a Rust guest uses, and a
/// bound on the one other thing a guest can grow.
const MAX_TABLE_ELEMENTS: usize = 100_000;

/// Longest guest output line logged whole, in bytes; a longer one is logged in pieces.
const MAX_LOG_LINE_BYTES: usize = 4096;

/// Most of each stderr line kept for error messages, in bytes.
const MAX_STDERR_TAIL_BYTES: usize = 512;

/// Last stderr lines of a call kept for error messages: a Rust panic writes three
/// ("panicked at", the message, a RUST_BACKTRACE note).
const MAX_STDERR_TAIL_LINES: usize = 3;

/// Caps linear memory and records the first denied growth, so a failed call can be
/// reported as [`super::PluginError::MemoryLimit`] (wasmtime's error is not a trap code).
struct Limiter {
    memory_bytes: usize,
    denied_bytes: Option<usize>,
}

impl wasmtime::ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.memory_bytes {
            self.denied_bytes = Some(desired);
            // An error (not `Ok(false)`) stops the guest at once instead of letting its
            // allocator abort with a less clear trap.
            return Err(wasmtime::Error::msg(format!(
                "memory limit of {} bytes exceeded",
                self.memory_bytes
            )));
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }
}

/// Everything a plugin's `Store` holds.
pub(crate) struct StoreState {
    wasi: WasiCtx,
    table: ResourceTable,
    limiter: Limiter,
    stderr_tail: Arc<Mutex<VecDeque<String>>>,
    deadline: CallDeadline,
}

/// The wall-clock deadline of the call running in a store, checked at every epoch tick
/// ([`crate::plugin::EPOCH_TICK_MS`]): before it, the guest *yields to Tokio* and goes on
/// (so a spinning guest never holds a runtime thread for more than one tick); past it,
/// the call traps with `Trap::Interrupt`, which the host reports as
/// [`crate::plugin::PluginError::Timeout`].
#[derive(Debug, Clone, Default)]
pub(crate) struct CallDeadline(Arc<std::sync::atomic::AtomicU64>);

/// Nanoseconds since the first use in this process (a monotonic clock as a `u64`).
fn now_nanos() -> u64 {
    static BASE: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let base = *BASE.get_or_init(std::time::Instant::now);
    u64::try_from(base.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

impl CallDeadline {
    /// Installs the check on `store` (once, when the store is made).
    pub(crate) fn install<T: 'static>(&self, store: &mut wasmtime::Store<T>) {
        let deadline = self.0.clone();
        store.epoch_deadline_callback(move |_| {
            if now_nanos() >= deadline.load(std::sync::atomic::Ordering::Relaxed) {
                Err(wasmtime::Trap::Interrupt.into())
            } else {
                Ok(wasmtime::UpdateDeadline::Yield(1))
            }
        });
    }

    /// Starts a call: `timeout_ms` from now, checked from the next epoch tick (the
    /// tickers run at least until just past it: [`run_ticker`]).
    pub(crate) fn arm<T>(&self, store: &mut wasmtime::Store<T>, timeout_ms: u64) {
        let at = now_nanos().saturating_add(timeout_ms.saturating_mul(1_000_000));
        self.0.store(at, std::sync::atomic::Ordering::Relaxed);
        store.set_epoch_deadline(1);
        need_ticks_until(at);
    }

    /// Moves the deadline `by` later: a host call that waited (for a SQLite lock, say)
    /// gives the guest that time back, so the deadline bounds the guest's own running
    /// time and the host call's wait is bounded by its own timeout.
    pub(crate) fn extend(&self, by: std::time::Duration) {
        let nanos = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        if let Ok(at) = self.0.fetch_update(
            std::sync::atomic::Ordering::Relaxed,
            std::sync::atomic::Ordering::Relaxed,
            |at| Some(at.saturating_add(nanos)),
        ) {
            need_ticks_until(at.saturating_add(nanos));
        }
    }
}

/// The latest call deadline armed in this process (`now_nanos` scale): epoch ticks are
/// needed until just past it, and not after, so a broker with no plugin call in flight
/// does not wake a thread every tick (it was half of an idle broker's CPU). Shared by
/// every host's ticker (tests make several; a tick more for another engine is harmless).
static TICKS_NEEDED_UNTIL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
/// Tickers parked (or about to park) because no deadline is ahead.
static TICKERS_IDLE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
/// Every running ticker thread, to unpark.
static TICKERS: Mutex<Vec<std::thread::Thread>> = Mutex::new(Vec::new());

/// Records that a call may run until `at` and wakes parked tickers. Pairs with the
/// check in [`run_ticker`] (both `SeqCst`): either the ticker sees the new deadline
/// before it parks, or this sees it idle and unparks it.
fn need_ticks_until(at: u64) {
    use std::sync::atomic::Ordering::SeqCst;
    TICKS_NEEDED_UNTIL.fetch_max(at, SeqCst);
    if TICKERS_IDLE.load(SeqCst) > 0 {
        for thread in TICKERS.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            thread.unpark();
        }
    }
}

/// The body of a host's ticker thread: advances `engine`'s epoch every `tick` while a
/// call deadline is ahead, and once more after the latest one has passed (that tick is
/// what traps a call still running past its deadline, however late the thread ran);
/// then parks until a call is armed. Returns when `stop` is set (the host unparks it).
pub(crate) fn run_ticker(
    engine: &wasmtime::Engine,
    stop: &std::sync::atomic::AtomicBool,
    tick: std::time::Duration,
) {
    use std::sync::atomic::Ordering::{Relaxed, SeqCst};
    TICKERS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(std::thread::current());
    while !stop.load(Relaxed) {
        std::thread::sleep(tick);
        engine.increment_epoch();
        if now_nanos() <= TICKS_NEEDED_UNTIL.load(SeqCst) {
            continue;
        }
        TICKERS_IDLE.fetch_add(1, SeqCst);
        while !stop.load(Relaxed) && now_nanos() > TICKS_NEEDED_UNTIL.load(SeqCst) {
            // A bounded park: a lost wake-up would cost a second, never a hang.
            std::thread::park_timeout(std::time::Duration::from_secs(1));
        }
        TICKERS_IDLE.fetch_sub(1, SeqCst);
    }
    let me = std::thread::current().id();
    TICKERS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|t| t.id() != me);
}

impl StoreState {
    /// The store's call deadline (see [`CallDeadline`]).
    pub(crate) fn deadline(&self) -> &CallDeadline {
        &self.deadline
    }

    /// A fresh state: empty WASI context with stdout/stderr logged as `plugin`.
    pub(crate) fn new(plugin: &Arc<str>, limits: &PluginLimits) -> Self {
        Self::build(plugin, limits, WasiCtxBuilder::new())
    }

    /// A state whose WASI context also preopens `dirs` (a connector's granted
    /// directories); otherwise as [`StoreState::new`].
    ///
    /// Errors: a directory that cannot be opened, as a message naming it.
    pub(crate) fn with_dirs(
        plugin: &Arc<str>,
        limits: &PluginLimits,
        dirs: &[super::DirGrant],
    ) -> Result<Self, String> {
        let mut wasi = WasiCtxBuilder::new();
        for d in dirs {
            let perms = if d.writable {
                FsPerms::ReadWrite
            } else {
                FsPerms::ReadOnly
            };
            wasi.preopened_dir(&d.host, &d.guest, perms)
                .map_err(|e| format!("cannot grant directory {}: {e:#}", d.host.display()))?;
        }
        Ok(Self::build(plugin, limits, wasi))
    }

    /// The state around `wasi`, with stdout/stderr logged as `plugin`.
    fn build(plugin: &Arc<str>, limits: &PluginLimits, mut wasi: WasiCtxBuilder) -> Self {
        let stderr_tail = Arc::new(Mutex::new(VecDeque::new()));
        wasi.stdout(GuestLog::new(plugin.clone(), "stdout", None))
            .stderr(GuestLog::new(
                plugin.clone(),
                "stderr",
                Some(stderr_tail.clone()),
            ));
        StoreState {
            wasi: wasi.build(),
            table: ResourceTable::new(),
            limiter: Limiter {
                memory_bytes: limits.memory_bytes,
                denied_bytes: None,
            },
            stderr_tail,
            deadline: CallDeadline::default(),
        }
    }

    /// The memory limiter, for a store whose data wraps a `StoreState`.
    pub(crate) fn limiter(&mut self) -> &mut dyn wasmtime::ResourceLimiter {
        &mut self.limiter
    }

    /// The memory size a guest was refused, if any growth was refused.
    pub(crate) fn memory_denied(&self) -> Option<usize> {
        self.limiter.denied_bytes
    }

    /// Forgets the stderr line of earlier calls; called before each call.
    pub(crate) fn begin_call(&mut self) {
        match self.stderr_tail.lock() {
            Ok(mut t) => t.clear(),
            Err(poisoned) => poisoned.into_inner().clear(),
        }
    }

    /// The last lines the guest wrote to stderr during this call (a panic message,
    /// typically), joined with " | ", if any.
    pub(crate) fn stderr_tail(&self) -> Option<String> {
        let tail = match self.stderr_tail.lock() {
            Ok(t) => t,
            Err(poisoned) => poisoned.into_inner(),
        };
        let lines: Vec<&str> = tail
            .iter()
            .map(|l| l.trim())
            .filter(|l| !l.is_empty())
            .collect();
        (!lines.is_empty()).then(|| lines.join(" | "))
    }
}

impl AsMut<StoreState> for StoreState {
    fn as_mut(&mut self) -> &mut StoreState {
        self
    }
}

impl WasiView for StoreState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// A guest output stream that logs whole lines through `tracing` (target
/// `weir::plugin::guest`, fields `plugin` and `stream`).
#[derive(Clone)]
struct GuestLog {
    plugin: Arc<str>,
    stream: &'static str,
    pending: Arc<Mutex<Vec<u8>>>,
    tail: Option<Arc<Mutex<VecDeque<String>>>>,
}

impl GuestLog {
    fn new(
        plugin: Arc<str>,
        stream: &'static str,
        tail: Option<Arc<Mutex<VecDeque<String>>>>,
    ) -> Self {
        GuestLog {
            plugin,
            stream,
            pending: Arc::new(Mutex::new(Vec::new())),
            tail,
        }
    }

    fn log_line(&self, line: &[u8]) {
        let text = String::from_utf8_lossy(line);
        let text = text.trim_end_matches('\r');
        tracing::info!(target: "weir::plugin::guest", plugin = %self.plugin, stream = self.stream, "{text}");
        if let Some(tail) = &self.tail {
            let mut tail = match tail.lock() {
                Ok(t) => t,
                Err(poisoned) => poisoned.into_inner(),
            };
            if tail.len() >= MAX_STDERR_TAIL_LINES {
                tail.pop_front();
            }
            let mut end = text.len().min(MAX_STDERR_TAIL_BYTES);
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            tail.push_back(text[..end].to_string());
        }
    }

    fn write_bytes(&self, bytes: &[u8]) {
        let mut pending = match self.pending.lock() {
            Ok(p) => p,
            Err(poisoned) => poisoned.into_inner(),
        };
        for &b in bytes {
            if b == b'\n' {
                self.log_line(&pending);
                pending.clear();
            } else {
                pending.push(b);
                if pending.len() >= MAX_LOG_LINE_BYTES {
                    self.log_line(&pending);
                    pending.clear();
                }
            }
        }
    }
}

impl IsTerminal for GuestLog {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for GuestLog {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl OutputStream for GuestLog {
    fn write(&mut self, bytes: bytes::Bytes) -> Result<(), StreamError> {
        self.write_bytes(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), StreamError> {
        Ok(())
    }

    fn check_write(&mut self) -> Result<usize, StreamError> {
        Ok(MAX_LOG_LINE_BYTES)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for GuestLog {
    async fn ready(&mut self) {}
}

impl tokio::io::AsyncWrite for GuestLog {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.write_bytes(buf);
        std::task::Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}
