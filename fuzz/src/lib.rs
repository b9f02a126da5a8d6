//! Shared by the fuzz targets: writing weir's valid seed inputs into an empty corpus
//! directory before libFuzzer reads it, so a first run starts from real frames, batches
//! and transform outputs instead of from nothing.

use std::path::PathBuf;

/// Writes `seeds()` as files `seed-<n>` into the corpus directory named on the command
/// line (`cargo fuzz run <target>` passes `fuzz/corpus/<target>`), when that directory
/// exists and is empty. Does nothing otherwise (a corpus already grown is kept as it is).
pub fn seed_empty_corpus(seeds: impl FnOnce() -> Vec<Vec<u8>>) {
    let Some(dir) = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .map(PathBuf::from)
        .find(|p| p.is_dir())
    else {
        return;
    };
    let empty = std::fs::read_dir(&dir).is_ok_and(|mut d| d.next().is_none());
    if !empty {
        return;
    }
    for (n, seed) in seeds().into_iter().enumerate() {
        if let Err(e) = std::fs::write(dir.join(format!("seed-{n:03}")), seed) {
            eprintln!("cannot write seed {n} into {}: {e}", dir.display());
            return;
        }
    }
}
