//! Which part of a record a plugin looks at: a JSON field of the value or a header. Shared
//! by the `filter` and `route` transforms so that they read `field` and `header` configs
//! alike and agree on what "absent" and "not JSON" mean.

use std::borrow::Cow;

use crate::json::{FieldPath, JsonError, Kind};
use crate::{Config, Record};

/// A record's JSON field (config `field`, a [`FieldPath`]) or header (config `header`, a
/// header name; the last header of that name counts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    /// A field of the record value, read as JSON.
    Field(FieldPath),
    /// A header, by name.
    Header(String),
}

/// What a [`Selector`] found in one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selected<'a> {
    /// The field's text ([`crate::json::Value::text`]: a string without quotes, other
    /// JSON as compact text) or the header's value bytes.
    Found(Cow<'a, [u8]>),
    /// Nothing there: the field is missing, or JSON `null`, or the record value is null
    /// (a tombstone has no fields); the header is missing or has a null value.
    Absent,
    /// `field` only: the record value is not JSON.
    NotJson(JsonError),
}

impl Selector {
    /// Reads config `field` or `header` (exactly one must be set). `plugin` prefixes the
    /// error messages, e.g. `filter: set exactly one of ...`.
    pub fn from_config(config: &Config, plugin: &str) -> Result<Self, String> {
        match (config.get("field"), config.get("header")) {
            (Some(field), None) => FieldPath::parse(field)
                .map(Selector::Field)
                .map_err(|e| format!("{plugin}: config `field`: {e}")),
            (None, Some(header)) if !header.is_empty() => Ok(Selector::Header(header.into())),
            (None, Some(_)) => Err(format!("{plugin}: config `header` is empty")),
            (Some(_), Some(_)) | (None, None) => Err(format!(
                "{plugin}: set exactly one of `field` (a JSON field path such as `user.id`) \
                 and `header` (a header name)"
            )),
        }
    }

    /// What this selector finds in `record`.
    pub fn select<'a>(&self, record: &Record<'a>) -> Selected<'a> {
        match self {
            Selector::Field(path) => {
                let Some(value) = record.value() else {
                    return Selected::Absent;
                };
                match path.lookup(value) {
                    Err(e) => Selected::NotJson(e),
                    Ok(None) => Selected::Absent,
                    Ok(Some(v)) if v.kind() == Kind::Null => Selected::Absent,
                    Ok(Some(v)) => Selected::Found(v.text()),
                }
            }
            Selector::Header(name) => match record.last_header(name).and_then(|h| h.value) {
                Some(v) => Selected::Found(Cow::Borrowed(v)),
                None => Selected::Absent,
            },
        }
    }
}
