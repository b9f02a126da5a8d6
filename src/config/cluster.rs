//! The KRaft keys: which roles this node plays, who the controller quorum is, and which
//! listener carries what (Kafka's `KRaftConfigs`, `QuorumConfig` and the listener checks
//! of `KafkaConfig.validateValues`).
//!
//! Owns: parsing `process.roles` and `controller.quorum.voters`, splitting `listeners`
//! into the Kafka listeners a broker serves and the CONTROLLER listener the quorum talks
//! over, and every cross-key check, each failing start-up with the key named. With
//! `controller.quorum.voters` empty (the default, and `weir serve` with no file) the node
//! is a one-voter quorum of itself and needs no CONTROLLER listener: the single node of
//! earlier versions, unchanged.
//!
//! Never does: I/O, or decide anything at run time (that is `cluster`).

use super::{ConfigError, Listener, RawConfig};

/// `process.roles`: what this node runs (KIP-631). Kafka requires the key; weir's
/// default is both (`broker,controller`, Kafka's "combined mode").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessRoles {
    /// Serves clients (the Kafka listeners, partitions, groups).
    pub broker: bool,
    /// Is a voter of the controller quorum (the Raft log `__cluster_metadata`).
    pub controller: bool,
}

impl ProcessRoles {
    /// Parses a comma-separated list of `broker` and `controller`, each at most once.
    ///
    /// Errors: [`ConfigError::InvalidValue`] naming `process.roles`.
    pub fn parse(text: &str) -> Result<ProcessRoles, ConfigError> {
        let bad = |message: String| ConfigError::InvalidValue {
            key: "process.roles".into(),
            message,
        };
        let mut roles = ProcessRoles {
            broker: false,
            controller: false,
        };
        for role in text.split(',').map(str::trim).filter(|r| !r.is_empty()) {
            let slot = match role {
                "broker" => &mut roles.broker,
                "controller" => &mut roles.controller,
                other => return Err(bad(format!("`{other}` is not broker or controller"))),
            };
            if std::mem::replace(slot, true) {
                return Err(bad(format!("`{role}` is listed twice")));
            }
        }
        if !roles.broker && !roles.controller {
            return Err(bad("at least one of broker and controller is needed".into()));
        }
        Ok(roles)
    }
}

/// One entry of `controller.quorum.voters`: `ID@HOST:PORT`, the address of that voter's
/// CONTROLLER listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuorumVoter {
    /// The voter's `node.id`.
    pub id: i32,
    /// Host or IP address of its CONTROLLER listener.
    pub host: String,
    /// Port of its CONTROLLER listener (never 0: the others must know it).
    pub port: u16,
}

/// Parses `controller.quorum.voters`: comma-separated `ID@HOST:PORT` (`[v6]:port`
/// allowed), ids ≥ 0 and distinct, ports 1–65535. Empty gives no voters.
///
/// Errors: [`ConfigError::InvalidValue`] naming `controller.quorum.voters`.
pub fn parse_voters(text: &str) -> Result<Vec<QuorumVoter>, ConfigError> {
    let mut voters: Vec<QuorumVoter> = Vec::new();
    for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let bad = |message: &str| ConfigError::InvalidValue {
            key: "controller.quorum.voters".into(),
            message: format!("`{entry}`: {message}"),
        };
        let (id, address) = entry
            .split_once('@')
            .ok_or_else(|| bad("expected ID@HOST:PORT"))?;
        let id: i32 = id
            .trim()
            .parse()
            .ok()
            .filter(|id| *id >= 0)
            .ok_or_else(|| bad("the id is not a node id (an integer ≥ 0)"))?;
        let (host, port) = address
            .rsplit_once(':')
            .ok_or_else(|| bad("expected HOST:PORT after @"))?;
        let port: u16 = port
            .parse()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| bad("port is not a number 1-65535"))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err(bad("no host"));
        }
        if voters.iter().any(|v| v.id == id) {
            return Err(bad(&format!("node id {id} is listed twice")));
        }
        voters.push(QuorumVoter {
            id,
            host: host.to_string(),
            port,
        });
    }
    Ok(voters)
}

/// The cluster side of the broker configuration, checked as a whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterSettings {
    /// `process.roles`.
    pub process_roles: ProcessRoles,
    /// `controller.quorum.voters` as configured; empty: this node alone
    /// ([`ClusterSettings::voters`] gives the effective set).
    pub quorum_voters: Vec<QuorumVoter>,
    /// `controller.listener.names`.
    pub controller_listener_names: Vec<String>,
    /// This node's CONTROLLER listener (the first `listeners` entry named in
    /// `controller.listener.names`), if it has one. Port 0 means its voter entry's port.
    pub controller_listener: Option<Listener>,
    /// `inter.broker.listener.name` (Kafka's default: `PLAINTEXT`).
    pub inter_broker_listener_name: String,
    /// `min.insync.replicas` (KIP-966's strict rule once replication lands).
    pub min_insync_replicas: i32,
    /// `offsets.topic.replication.factor` (Kafka's default 3; capped at the live broker
    /// count when `__consumer_offsets` is created).
    pub offsets_topic_replication_factor: i16,
    /// `broker.session.timeout.ms`: a broker not heard from for this long is fenced.
    pub broker_session_timeout_ms: u64,
    /// `broker.heartbeat.interval.ms`: how often a broker heartbeats to the controller.
    pub broker_heartbeat_interval_ms: u64,
    /// `controller.quorum.election.timeout.ms` (Kafka's default 1000): a voter that hears
    /// no quorum leader for 1.5–2 times this stands for election
    /// (`cluster::raft::RaftTiming`).
    pub controller_quorum_election_timeout_ms: u64,
}

impl ClusterSettings {
    /// Whether `controller.quorum.voters` is empty: a one-voter quorum of this node with
    /// no network between voters (earlier versions' single node).
    pub fn is_single_node(&self) -> bool {
        self.quorum_voters.is_empty()
    }

    /// The effective voters: the configured ones, or this node alone (with its controller
    /// listener's address when it has one, else no address: nobody needs to dial it).
    pub fn voters(&self, node_id: i32) -> Vec<QuorumVoter> {
        if !self.quorum_voters.is_empty() {
            return self.quorum_voters.clone();
        }
        let (host, port) = self
            .controller_listener
            .as_ref()
            .map_or((String::new(), 0), |l| (l.host.clone(), l.port));
        vec![QuorumVoter {
            id: node_id,
            host,
            port,
        }]
    }
}

fn invalid(key: &str, message: String) -> ConfigError {
    ConfigError::InvalidValue {
        key: key.to_string(),
        message,
    }
}

/// Kafka's security protocols, the values `listener.security.protocol.map` may give.
const SECURITY_PROTOCOLS: [&str; 4] = ["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"];

/// Parses `listener.security.protocol.map` (`NAME:PROTOCOL,...`) into (name, protocol)
/// pairs, as Kafka's `KafkaConfig.effectiveListenerSecurityProtocolMap` reads it.
///
/// Errors: [`ConfigError::InvalidValue`] for an entry without `:`, a name twice, or a
/// protocol that is not one of Kafka's four.
fn security_protocol_map(text: &str) -> Result<Vec<(String, String)>, ConfigError> {
    let key = "listener.security.protocol.map";
    let mut out: Vec<(String, String)> = Vec::new();
    for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let Some((name, protocol)) = entry.split_once(':') else {
            return Err(invalid(key, format!("`{entry}`: expected NAME:PROTOCOL")));
        };
        let (name, protocol) = (name.trim(), protocol.trim().to_ascii_uppercase());
        if !SECURITY_PROTOCOLS.contains(&protocol.as_str()) {
            return Err(invalid(
                key,
                format!(
                    "`{entry}`: {protocol} is not a security protocol ({})",
                    SECURITY_PROTOCOLS.join(", ")
                ),
            ));
        }
        if out.iter().any(|(n, _)| n == name) {
            return Err(invalid(
                key,
                format!("the listener name {name} is mapped twice"),
            ));
        }
        out.push((name.to_string(), protocol));
    }
    Ok(out)
}

/// Checks that Kafka listener `name` is served in plain text: it maps to PLAINTEXT in
/// `protocols` (`listener.security.protocol.map`), or, unmapped, is itself called
/// PLAINTEXT (Kafka: a name that is a protocol's needs no entry).
///
/// Errors: [`ConfigError::InvalidValue`] on `listeners`: no protocol for the name (Kafka's
/// "No security protocol defined for listener"), or one weir does not serve yet (SSL,
/// SASL_*).
fn check_plaintext(protocols: &[(String, String)], name: &str) -> Result<(), ConfigError> {
    let protocol = protocols
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, p)| p.as_str())
        .or_else(|| SECURITY_PROTOCOLS.iter().copied().find(|p| *p == name));
    match protocol {
        Some("PLAINTEXT") => Ok(()),
        Some(other) => Err(invalid(
            "listeners",
            format!("{name}: its security protocol is {other}; weir serves PLAINTEXT listeners only (TLS and SASL are not implemented)"),
        )),
        None => Err(invalid(
            "listeners",
            format!("{name}: no security protocol defined for this listener name (listener.security.protocol.map)"),
        )),
    }
}

/// Checks the KRaft keys against each other and splits `listeners`: returns the settings
/// and the Kafka (non-controller) listeners the broker serves.
///
/// Errors: [`ConfigError::InvalidValue`] naming the key at fault: `process.roles`,
/// `controller.quorum.voters` (unparsable, or empty for a node that is not a combined
/// broker and controller), `node.id` (not among the voters of a controller, or among them
/// for a broker-only node), `controller.listener.names` (empty with voters set),
/// `listeners` (no CONTROLLER listener on a controller, one on a broker-only node, a
/// port that is not the voter's, no Kafka listener on a broker, a name twice, a Kafka
/// listener whose `listener.security.protocol.map` protocol is not PLAINTEXT or that has
/// none), `listener.security.protocol.map` (unparsable), `advertised.listeners` (a
/// controller listener, or a name not in `listeners`), `inter.broker.listener.name`,
/// `broker.heartbeat.interval.ms` (not below the session timeout).
pub(super) fn cluster_settings(
    raw: &RawConfig,
    node_id: i32,
    listeners: Vec<Listener>,
    advertised: &[Listener],
) -> Result<(ClusterSettings, Vec<Listener>), ConfigError> {
    let text = |k: &str| raw.value(k).unwrap_or_default();
    let int = |k: &str| -> Result<i64, ConfigError> {
        let v = text(k);
        v.parse()
            .map_err(|_| invalid(k, format!("`{v}` is not an integer")))
    };
    let roles = ProcessRoles::parse(&text("process.roles"))?;
    let voters = parse_voters(&text("controller.quorum.voters"))?;
    let controller_names: Vec<String> = text("controller.listener.names")
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    let is_controller_name = |name: &str| controller_names.iter().any(|n| n == name);
    if !voters.is_empty() && controller_names.is_empty() {
        return Err(invalid(
            "controller.listener.names",
            "empty, but controller.quorum.voters is set: name the CONTROLLER listener".into(),
        ));
    }

    let protocols = security_protocol_map(&text("listener.security.protocol.map"))?;
    for (i, l) in listeners.iter().enumerate() {
        if listeners[..i].iter().any(|o| o.name == l.name) {
            return Err(invalid(
                "listeners",
                format!("the listener name {} is used twice", l.name),
            ));
        }
        if !is_controller_name(&l.name) {
            check_plaintext(&protocols, &l.name)?;
        }
    }
    let (controller_listeners, broker_listeners): (Vec<Listener>, Vec<Listener>) = listeners
        .into_iter()
        .partition(|l| is_controller_name(&l.name));
    let controller_listener = controller_names
        .iter()
        .find_map(|n| controller_listeners.iter().find(|l| &l.name == n))
        .cloned();

    if voters.is_empty() {
        if !(roles.broker && roles.controller) {
            return Err(invalid(
                "controller.quorum.voters",
                "empty: the node would be a one-voter quorum of itself, which needs process.roles=broker,controller".into(),
            ));
        }
    } else {
        let me = voters.iter().find(|v| v.id == node_id);
        if roles.controller {
            let Some(me) = me else {
                return Err(invalid(
                    "node.id",
                    format!("{node_id} is a controller (process.roles) but not in controller.quorum.voters"),
                ));
            };
            let Some(l) = &controller_listener else {
                return Err(invalid(
                    "listeners",
                    format!(
                        "a controller needs a listener named in controller.listener.names ({})",
                        controller_names.join(",")
                    ),
                ));
            };
            if l.port != 0 && l.port != me.port {
                return Err(invalid(
                    "listeners",
                    format!(
                        "{}://{}:{} is not on the port controller.quorum.voters gives node {node_id} ({})",
                        l.name, l.host, l.port, me.port
                    ),
                ));
            }
        } else {
            if me.is_some() {
                return Err(invalid(
                    "node.id",
                    format!("{node_id} is in controller.quorum.voters, but process.roles has no controller"),
                ));
            }
            if let Some(l) = controller_listeners.first() {
                return Err(invalid(
                    "listeners",
                    format!("{}: a broker-only node has no controller listener", l.name),
                ));
            }
        }
    }
    if roles.broker {
        if broker_listeners.is_empty() {
            return Err(invalid(
                "listeners",
                "a broker needs at least one PLAINTEXT listener".into(),
            ));
        }
    } else if let Some(l) = broker_listeners.first() {
        return Err(invalid(
            "listeners",
            format!(
                "{}: a controller-only node has only controller listeners",
                l.name
            ),
        ));
    }

    let inter_broker = text("inter.broker.listener.name");
    if is_controller_name(&inter_broker) {
        return Err(invalid(
            "inter.broker.listener.name",
            format!("{inter_broker} is a controller listener (controller.listener.names)"),
        ));
    }
    if roles.broker && !broker_listeners.iter().any(|l| l.name == inter_broker) {
        return Err(invalid(
            "inter.broker.listener.name",
            format!("{inter_broker} is not one of the listeners"),
        ));
    }
    for a in advertised {
        if is_controller_name(&a.name) {
            return Err(invalid(
                "advertised.listeners",
                format!(
                    "{}: a controller listener is not advertised to clients",
                    a.name
                ),
            ));
        }
        if !broker_listeners.iter().any(|l| l.name == a.name) {
            return Err(invalid(
                "advertised.listeners",
                format!("{}: not the name of one of the listeners", a.name),
            ));
        }
    }

    let session_ms = int("broker.session.timeout.ms")?;
    let heartbeat_ms = int("broker.heartbeat.interval.ms")?;
    if heartbeat_ms >= session_ms {
        return Err(invalid(
            "broker.heartbeat.interval.ms",
            format!("{heartbeat_ms} is not below broker.session.timeout.ms ({session_ms})"),
        ));
    }
    let offsets_rf = int("offsets.topic.replication.factor")?;
    let settings = ClusterSettings {
        process_roles: roles,
        quorum_voters: voters,
        controller_listener_names: controller_names,
        controller_listener,
        inter_broker_listener_name: inter_broker,
        min_insync_replicas: int("min.insync.replicas")? as i32,
        offsets_topic_replication_factor: i16::try_from(offsets_rf).map_err(|_| {
            invalid(
                "offsets.topic.replication.factor",
                format!("{offsets_rf} does not fit a 16-bit int"),
            )
        })?,
        broker_session_timeout_ms: session_ms as u64,
        broker_heartbeat_interval_ms: heartbeat_ms as u64,
        controller_quorum_election_timeout_ms: int("controller.quorum.election.timeout.ms")? as u64,
    };
    Ok((settings, broker_listeners))
}

#[cfg(test)]
mod tests {
    use crate::config::{BrokerConfig, RawConfig};

    /// Builds a config from overrides; the error names a key.
    fn load(overrides: &[&str]) -> Result<BrokerConfig, String> {
        let mut raw = RawConfig::default();
        raw.apply_overrides(overrides).map_err(|e| e.to_string())?;
        BrokerConfig::from_raw(raw).map_err(|e| e.to_string())
    }

    const THREE: &str =
        "controller.quorum.voters=1@127.0.0.1:9093,2@127.0.0.1:9095,3@127.0.0.1:9097";

    fn node(id: i32) -> Vec<String> {
        vec![
            format!("node.id={id}"),
            THREE.to_string(),
            format!(
                "listeners=PLAINTEXT://127.0.0.1:{},CONTROLLER://127.0.0.1:{}",
                9092 + 2 * (id - 1),
                9093 + 2 * (id - 1)
            ),
            "controller.listener.names=CONTROLLER".to_string(),
        ]
    }

    fn with(base: Vec<String>, more: &[&str]) -> Vec<String> {
        let mut v = base;
        v.extend(more.iter().map(|s| s.to_string()));
        v
    }

    fn refused(overrides: &[String], key: &str) {
        let o: Vec<&str> = overrides.iter().map(String::as_str).collect();
        match load(&o) {
            Ok(c) => panic!("{overrides:?} accepted: {:?}", c.cluster),
            Err(e) => assert!(e.contains(&format!("`{key}`")), "{overrides:?}: {e}"),
        }
    }

    #[test]
    fn no_voters_is_a_single_node_as_before() {
        let c = BrokerConfig::defaults();
        let s = &c.cluster;
        assert!(s.is_single_node());
        assert!(s.process_roles.broker && s.process_roles.controller);
        assert_eq!(s.voters(1).len(), 1);
        assert_eq!(s.voters(1)[0].id, 1);
        assert_eq!(s.controller_listener, None);
        assert_eq!(s.inter_broker_listener_name, "PLAINTEXT");
        assert_eq!(
            (s.min_insync_replicas, s.offsets_topic_replication_factor),
            (1, 3)
        );
        assert_eq!(
            (s.broker_session_timeout_ms, s.broker_heartbeat_interval_ms),
            (9000, 2000)
        );
        assert_eq!(c.listeners.len(), 1);
    }

    #[test]
    fn a_three_voter_node_splits_its_listeners() {
        let o = node(2);
        let o: Vec<&str> = o.iter().map(String::as_str).collect();
        let c = load(&o).unwrap();
        assert!(!c.cluster.is_single_node());
        assert_eq!(c.cluster.voters(2).len(), 3);
        assert_eq!(c.cluster.voters(2)[1].port, 9095);
        let l = c.cluster.controller_listener.as_ref().unwrap();
        assert_eq!((l.name.as_str(), l.port), ("CONTROLLER", 9095));
        // The Kafka listeners are the broker's only.
        assert_eq!(c.listeners.len(), 1);
        assert_eq!(c.listeners[0].port, 9094);
        // Port 0 for the controller listener takes the voter's port.
        let o = with(
            node(2),
            &["listeners=PLAINTEXT://127.0.0.1:0,CONTROLLER://127.0.0.1:0"],
        );
        let o: Vec<&str> = o.iter().map(String::as_str).collect();
        assert!(load(&o).is_ok());
    }

    #[test]
    fn process_roles_are_checked() {
        refused(
            &with(node(1), &["process.roles=broker,broker"]),
            "process.roles",
        );
        refused(
            &with(node(1), &["process.roles=zookeeper"]),
            "process.roles",
        );
        refused(&with(node(1), &["process.roles="]), "process.roles");
    }

    #[test]
    fn unparsable_voters_are_refused() {
        for bad in [
            "1@127.0.0.1",
            "127.0.0.1:9093",
            "x@127.0.0.1:9093",
            "-1@127.0.0.1:9093",
            "1@127.0.0.1:0",
            "1@127.0.0.1:99999",
            "1@:9093",
            "1@a:9093,1@b:9094",
        ] {
            refused(
                &with(node(1), &[&format!("controller.quorum.voters={bad}")]),
                "controller.quorum.voters",
            );
        }
    }

    #[test]
    fn a_controller_must_be_a_voter_with_a_controller_listener() {
        refused(&with(node(1), &["node.id=4"]), "node.id");
        refused(
            &with(node(1), &["listeners=PLAINTEXT://127.0.0.1:9092"]),
            "listeners",
        );
        refused(
            &with(
                node(1),
                &["listeners=PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9999"],
            ),
            "listeners",
        );
        refused(
            &with(node(1), &["controller.listener.names="]),
            "controller.listener.names",
        );
        // An unknown listener name is neither PLAINTEXT nor a controller listener.
        refused(
            &with(node(1), &["controller.listener.names=QUORUM"]),
            "listeners",
        );
    }

    #[test]
    fn broker_only_and_controller_only_nodes_are_checked() {
        // A broker-only node is no voter and has no controller listener.
        refused(&with(node(1), &["process.roles=broker"]), "node.id");
        let o = with(node(1), &["process.roles=broker", "node.id=4"]);
        refused(&o, "listeners");
        let o = with(o, &["listeners=PLAINTEXT://127.0.0.1:9092"]);
        let o: Vec<&str> = o.iter().map(String::as_str).collect();
        assert!(load(&o).is_ok());
        // A controller-only node serves no Kafka listener.
        refused(&with(node(1), &["process.roles=controller"]), "listeners");
        // Without voters a node must be both.
        refused(
            &["process.roles=broker".to_string()],
            "controller.quorum.voters",
        );
    }

    #[test]
    fn listener_names_are_checked() {
        refused(
            &with(node(1), &["inter.broker.listener.name=CONTROLLER"]),
            "inter.broker.listener.name",
        );
        refused(
            &with(node(1), &["inter.broker.listener.name=INTERNAL"]),
            "inter.broker.listener.name",
        );
        refused(
            &with(
                node(1),
                &["advertised.listeners=CONTROLLER://10.0.0.1:9093"],
            ),
            "advertised.listeners",
        );
        refused(
            &with(
                node(1),
                &["listeners=PLAINTEXT://127.0.0.1:9092,PLAINTEXT://127.0.0.1:9094,CONTROLLER://127.0.0.1:9093"],
            ),
            "listeners",
        );
        refused(&["listeners=SSL://127.0.0.1:9092".to_string()], "listeners");
    }

    #[test]
    fn session_and_replication_keys_are_checked() {
        refused(
            &["broker.session.timeout.ms=1000".to_string()],
            "broker.heartbeat.interval.ms",
        );
        refused(
            &["offsets.topic.replication.factor=0".to_string()],
            "offsets.topic.replication.factor",
        );
        refused(
            &["offsets.topic.replication.factor=40000".to_string()],
            "offsets.topic.replication.factor",
        );
        refused(
            &["min.insync.replicas=0".to_string()],
            "min.insync.replicas",
        );
        refused(
            &["default.replication.factor=0".to_string()],
            "default.replication.factor",
        );
    }
}
