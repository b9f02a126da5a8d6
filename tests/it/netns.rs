//! [`TestNet`]: test hosts in network namespaces, so a test can cut one broker off the
//! network while its process runs on (a partition, which loopback alone cannot make).
//!
//! Host `id` is the namespace `wn<tag>-<id>` (the tag: this process's id and a letter per
//! net it made) with the address `10.213.<subnet>.<id>/24` on
//! a veth whose other end is a port of the bridge `wb<tag>` in the test's own namespace;
//! the bridge has `.254`, so the test's clients reach every host and the hosts reach each
//! other through it. [`TestNet::cut`] sets the host's bridge port down: nothing passes
//! in either direction (connections stall, new ones fail) until [`TestNet::heal`]. The
//! addresses exist only inside namespaces this test made (no route leads off the
//! machine); the subnet is one no other interface here has.
//!
//! Needs root and iproute2's `ip` (tests/install-deps.sh installs it); [`TestNet::create`]
//! says why when it cannot. Drop deletes the namespaces (and with them the veths) and
//! the bridge; the processes in them must be stopped first.

use std::process::Command;

/// Runs `ip ARGS`; the error names the command and what it printed.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Whether an address of `10.213.<subnet>.0/24` is on an interface here already.
fn subnet_in_use(subnet: u32) -> bool {
    Command::new("ip")
        .args(["-o", "addr", "show", "to", &format!("10.213.{subnet}.0/24")])
        .output()
        .map(|o| !o.stdout.is_empty())
        .unwrap_or(true)
}

/// Network namespaces `1..=n` on one bridge; see the module doc.
pub(crate) struct TestNet {
    tag: String,
    subnet: u32,
    n: usize,
}

impl TestNet {
    /// Makes hosts `1..=n` (n ≤ 200). Errors when this process cannot (not root, no
    /// `ip`, no free subnet), with the reason; whatever was made is removed.
    pub(crate) fn create(n: usize) -> Result<TestNet, String> {
        use std::sync::atomic::{AtomicU32, Ordering};
        /// Nets made by this process so far: tests run as threads of one process.
        static MADE: AtomicU32 = AtomicU32::new(0);
        /// One net made at a time here, so two cannot pick the same free subnet.
        static CREATING: std::sync::Mutex<()> = std::sync::Mutex::new(());
        assert!((1..=200).contains(&n));
        let _one_at_a_time = CREATING.lock().unwrap_or_else(|e| e.into_inner());
        let pid = std::process::id();
        let k = MADE.fetch_add(1, Ordering::Relaxed);
        let subnet = (0..250)
            .map(|i| (pid + 7 * k + i) % 250 + 1)
            .find(|s| !subnet_in_use(*s))
            .ok_or("no free 10.213.x.0/24 subnet")?;
        let net = TestNet {
            // Interface names stay within 15 bytes: `wv` + tag + `h` + id.
            tag: format!("{}{}", pid % 100_000, (b'a' + (k % 26) as u8) as char),
            subnet,
            n: 0,
        };
        net.add_bridge()?;
        let mut net = net;
        for id in 1..=n as i32 {
            net.n = id as usize;
            net.add_host(id)?;
        }
        Ok(net)
    }

    fn bridge(&self) -> String {
        format!("wb{}", self.tag)
    }

    /// Host `id`'s namespace.
    pub(crate) fn namespace(&self, id: i32) -> String {
        format!("wn{}-{id}", self.tag)
    }

    /// Host `id`'s veth end on the bridge (what [`TestNet::cut`] sets down).
    fn bridge_port(&self, id: i32) -> String {
        format!("wv{}h{id}", self.tag)
    }

    fn add_bridge(&self) -> Result<(), String> {
        let bridge = self.bridge();
        // A bridge left by a killed run with the same tag goes first.
        let _ = ip(&["link", "del", &bridge]);
        ip(&["link", "add", &bridge, "type", "bridge"])?;
        let made = ip(&[
            "addr",
            "add",
            &format!("10.213.{}.254/24", self.subnet),
            "dev",
            &bridge,
        ])
        .and_then(|()| ip(&["link", "set", &bridge, "up"]));
        if made.is_err() {
            let _ = ip(&["link", "del", &bridge]);
        }
        made
    }

    fn add_host(&self, id: i32) -> Result<(), String> {
        let ns = self.namespace(id);
        let (outer, inner) = (self.bridge_port(id), format!("wv{}n{id}", self.tag));
        let _ = ip(&["netns", "del", &ns]);
        ip(&["netns", "add", &ns])?;
        ip(&[
            "link", "add", &outer, "type", "veth", "peer", "name", &inner,
        ])?;
        ip(&["link", "set", &inner, "netns", &ns])?;
        ip(&["link", "set", &outer, "master", &self.bridge(), "up"])?;
        ip(&[
            "-n",
            &ns,
            "addr",
            "add",
            &format!("{}/24", self.addr(id)),
            "dev",
            &inner,
        ])?;
        ip(&["-n", &ns, "link", "set", &inner, "up"])?;
        ip(&["-n", &ns, "link", "set", "lo", "up"])
    }

    /// Host `id`'s address, `10.213.<subnet>.<id>`.
    pub(crate) fn addr(&self, id: i32) -> String {
        format!("10.213.{}.{id}", self.subnet)
    }

    /// Cuts host `id` off: its bridge port goes down.
    pub(crate) fn cut(&self, id: i32) {
        ip(&["link", "set", &self.bridge_port(id), "down"]).expect("cut");
    }

    /// Undoes [`TestNet::cut`].
    pub(crate) fn heal(&self, id: i32) {
        ip(&["link", "set", &self.bridge_port(id), "up"]).expect("heal");
    }
}

impl Drop for TestNet {
    fn drop(&mut self) {
        for id in 1..=self.n as i32 {
            let _ = ip(&["netns", "del", &self.namespace(id)]);
        }
        let _ = ip(&["link", "del", &self.bridge()]);
    }
}
