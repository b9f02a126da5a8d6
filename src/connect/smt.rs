//! `transforms`: a chain of transform components applied inside a connector, as Kafka
//! Connect's single message transforms (SMTs).
//!
//! Keys, Kafka Connect's shape:
//!
//! ```toml
//! transforms = "mask,keep"                      # aliases, applied in this order
//! transforms.mask.type = "/opt/weir/plugins/redact.wasm"
//! transforms.mask.fields = "email"              # every other transforms.mask.* key
//! transforms.keep.type = "/opt/weir/plugins/filter.wasm"
//! transforms.keep.field = "country"
//! transforms.keep.equals = "NL"
//! ```
//!
//! `transforms.<alias>.type` names a component of world `transform` (the same plugins
//! the broker's transforms run: `plugins/redact`, `filter`, `route`, ...); a relative
//! path is made absolute against the broker's working directory. Every other
//! `transforms.<alias>.<key>` reaches that component's `open` as `<key>`.
//!
//! Where the chain runs, as in Kafka Connect: in a source, on the connector's records
//! before the converters serialize them; in a sink, after the converters read them and
//! before `put`. A transform may drop a record (its source offset is still committed:
//! it was handled), rewrite it, or route it to another topic (sources: that topic is
//! written; sinks: the connector sees that topic name).
//!
//! Errors: a transform that fails a batch fails the task under `errors.tolerance=none`
//! (the retry and FAILED rules of the runtime apply). Under `all` the batch is applied
//! again one record at a time and the records that fail alone are skipped, each
//! reported to the caller with its reason.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::plugin::{BatchContext, PluginError, PluginHost, Record, Transform};

/// One step of the chain, as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SmtSpec {
    /// The alias in `transforms`.
    pub alias: String,
    /// `transforms.<alias>.type`, absolute.
    pub wasm: PathBuf,
    /// The step's own keys (prefix removed), for its `open`.
    pub config: Vec<(String, String)>,
}

/// Reads the chain from a connector's keys.
///
/// Errors: an alias without `transforms.<alias>.type`, an alias listed twice, a path
/// that cannot be made absolute, as (key, message).
pub(crate) fn specs_from_keys(
    keys: &BTreeMap<String, String>,
) -> Result<Vec<SmtSpec>, (String, String)> {
    let Some(list) = keys.get("transforms") else {
        return Ok(Vec::new());
    };
    let mut specs: Vec<SmtSpec> = Vec::new();
    for alias in list.split(',').map(str::trim).filter(|a| !a.is_empty()) {
        if specs.iter().any(|s| s.alias == alias) {
            return Err((
                "transforms".into(),
                format!("alias `{alias}` is listed twice"),
            ));
        }
        let type_key = format!("transforms.{alias}.type");
        let wasm = keys
            .get(&type_key)
            .map(|t| t.trim())
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                (
                    type_key.clone(),
                    "required: the path of a transform component (.wasm)".to_string(),
                )
            })?;
        let wasm = std::path::absolute(wasm).map_err(|e| {
            (
                type_key.clone(),
                format!("cannot make `{wasm}` absolute: {e}"),
            )
        })?;
        let prefix = format!("transforms.{alias}.");
        let config = keys
            .iter()
            .filter_map(|(k, v)| {
                let rest = k.strip_prefix(&prefix)?;
                (rest != "type").then(|| (rest.to_string(), v.clone()))
            })
            .collect();
        specs.push(SmtSpec {
            alias: alias.to_string(),
            wasm,
            config,
        });
    }
    Ok(specs)
}

/// A record in the chain: the index of the connector record it came from, its topic,
/// the record.
pub(crate) type ChainRecord = (usize, String, Record);

/// The loaded chain of one task attempt.
pub(crate) struct Chain {
    steps: Vec<(String, Transform)>,
}

impl Chain {
    /// Loads every step (in order) and opens it with its config.
    ///
    /// Errors: the [`PluginError`] of the first step that does not load, with its alias
    /// in the message.
    pub(crate) async fn load(
        plugins: &PluginHost,
        specs: &[SmtSpec],
    ) -> Result<Chain, PluginError> {
        let mut steps = Vec::with_capacity(specs.len());
        for s in specs {
            let t = plugins
                .load_transform(&s.wasm, &s.config)
                .await
                .map_err(|e| PluginError::Failed {
                    plugin: s.wasm.display().to_string(),
                    message: format!("transforms.{}: {e}", s.alias),
                    record_index: None,
                })?;
            steps.push((s.alias.clone(), t));
        }
        Ok(Chain { steps })
    }

    /// True when there are no steps.
    pub(crate) fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// Runs `records` through every step; `partition` goes into the batch context (-1
    /// for sources). With `skip_failures` (errors.tolerance=all) a failing batch is
    /// retried record by record and what fails alone is dropped and returned with its
    /// reason as (connector record index, message).
    ///
    /// Errors: a step's [`PluginError`] when `skip_failures` is off.
    pub(crate) async fn apply(
        &mut self,
        partition: i32,
        mut records: Vec<ChainRecord>,
        skip_failures: bool,
    ) -> Result<(Vec<ChainRecord>, Vec<(usize, String)>), PluginError> {
        let mut failed = Vec::new();
        for (alias, step) in &mut self.steps {
            if records.is_empty() {
                break;
            }
            match apply_step(step, partition, &records).await {
                Ok(out) => records = out,
                Err(e) if !skip_failures => {
                    return Err(PluginError::Failed {
                        plugin: step.name().to_string(),
                        message: format!("transforms.{alias}: {e}"),
                        record_index: None,
                    })
                }
                Err(_) => {
                    let mut kept = Vec::with_capacity(records.len());
                    for r in records {
                        let origin = r.0;
                        match apply_step(step, partition, std::slice::from_ref(&r)).await {
                            Ok(out) => kept.extend(out),
                            Err(e) => failed.push((origin, format!("transforms.{alias}: {e}"))),
                        }
                    }
                    records = kept;
                }
            }
        }
        Ok((records, failed))
    }
}

/// One step over `records` (runs of one topic per call, as a batch has one context).
async fn apply_step(
    step: &mut Transform,
    partition: i32,
    records: &[ChainRecord],
) -> Result<Vec<ChainRecord>, PluginError> {
    let mut out = Vec::with_capacity(records.len());
    let mut start = 0;
    while start < records.len() {
        let topic = &records[start].1;
        let end = records[start..]
            .iter()
            .position(|r| &r.1 != topic)
            .map_or(records.len(), |n| start + n);
        let batch: Vec<Record> = records[start..end].iter().map(|r| r.2.clone()).collect();
        let context = BatchContext {
            topic: topic.clone(),
            partition,
            base_offset: -1,
        };
        let outputs = step.apply(&context, &batch).await?;
        for o in outputs.iter() {
            let o = o.to_output();
            let origin = &records[start + o.input_index as usize];
            out.push((
                origin.0,
                o.topic.unwrap_or_else(|| origin.1.clone()),
                o.record,
            ));
        }
        start = end;
    }
    Ok(out)
}
