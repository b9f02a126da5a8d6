//! weir's integration tests: one binary (STYLE: one integration-test binary keeps CI build
//! time down). Every test starts a real broker (in process on an ephemeral port, or the
//! `weir` binary) and drives it with real Kafka clients: rdkafka (librdkafka) from Rust,
//! kcat, confluent-kafka, kafka-python, aiokafka and kafkajs from scripts, plus raw frames
//! for bad input.

mod admin;
mod architecture;
mod bad_input;
mod cli;
mod cli_failures;
mod clients;
mod cluster;
mod cluster_clients;
mod cluster_connect;
mod cluster_consumer_protocol;
mod cluster_describe;
mod cluster_fixture;
mod cluster_log_dirs;
mod cluster_placement;
mod cluster_roles;
mod cluster_scenarios;
mod cluster_transforms;
mod cluster_up;
mod config;
mod connect;
mod connect_eos;
mod connect_http;
mod connect_regex;
mod connect_rest;
mod connect_sqlite;
mod connect_state;
mod consumer_protocol;
mod consumer_protocol_bad_input;
mod crash;
mod delete_records;
mod duplicate_registration;
mod dynamic_configs;
mod fetch;
mod fetch_sessions;
mod follower_fetch;
mod fuzz_frames;
mod group_protocol;
mod groups;
mod guests;
mod harness;
mod inline;
mod leader_election;
mod lifecycle;
mod listeners;
mod log_dirs;
mod many_partitions;
mod metrics;
mod netns;
mod plugins;
mod rdkafka_client;
mod reassignment;
mod replication;
mod replication_divergence;
mod replication_faults;
mod replication_hw_checkpoint;
mod replication_restart;
mod rest_produce;
mod retention;
mod transactions;
mod transactions_log;
mod transactions_v2;
mod transforms;
