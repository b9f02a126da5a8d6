//! weir: a Kafka-compatible message broker.
//!
//! Modules in reading order: `config` (keys and defaults) → `server` (sockets and frames)
//! → `protocol` (one handler per Kafka API) → `topics` (creating topics, changing their
//! configs) → `replica` (hosted partitions) → `log` (segments on disk) → `purgatory`
//! (parked long polls) → `cluster` (topics and ids) → `broker` (wiring: builds every
//! owner and hands each layer what it calls) → `cli` (the `weir` command). See
//! ARCHITECTURE.md.

pub mod admin;
pub mod broker;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod connect;
pub mod dead_letter;
pub mod fswatch;
#[doc(hidden)]
pub mod fuzzing;
pub mod group;
pub mod ingest;
pub mod internal_topic;
pub mod log;
pub mod metrics;
pub mod plugin;
pub mod protocol;
pub mod purgatory;
pub mod replica;
pub mod server;
pub mod topics;
pub mod transform;
