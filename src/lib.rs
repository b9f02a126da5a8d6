//! weir: a Kafka-compatible message broker.
//!
//! Modules in reading order: `config` (keys and defaults) → `server` (sockets and frames)
//! → `protocol` (one handler per Kafka API) → `topics` (creating topics, changing their
//! configs) → `replica` (hosted partitions) → `log` (segments on disk) → `purgatory`
//! (parked long polls) → `cluster` (topics and ids) → `broker` (wiring: builds every
//! owner and hands each layer what it calls) → `cli` (the `weir` command). See
//! ARCHITECTURE.md.

#![warn(unreachable_pub)]

mod admin;
pub mod broker;
pub mod cli;
mod cluster;
pub mod config;
mod connect;
mod dead_letter;
pub mod fetch_session;
mod fswatch;
#[doc(hidden)]
pub mod fuzzing;
mod group;
pub mod ingest;
mod internal_topic;
pub mod log;
pub mod metrics;
mod peer;
pub mod plugin;
pub mod protocol;
mod purgatory;
pub mod replica;
mod replication;
mod server;
mod topics;
pub mod transform;
pub mod txn;
mod worker_io;
