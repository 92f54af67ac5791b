//! The tuner's remembered choices: in memory, and in a JSON file when there is one (see
//! the `tune` module for where). Held by the context, read and written by the tuner.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;

use serde::{de::DeserializeOwned, Serialize};

/// Remembered choices: in memory, and in a JSON file when there is one.
pub struct TuneCache {
    path: Option<PathBuf>,
    choices: Mutex<HashMap<String, serde_json::Value>>,
}

impl TuneCache {
    /// The cache at the default place (see the module docs), loaded if it exists.
    pub fn from_env() -> Self {
        let path = match std::env::var("WGPU_ATTENTION_TUNE_CACHE") {
            Ok(v) if v.eq_ignore_ascii_case("off") => None,
            Ok(v) if !v.is_empty() => Some(PathBuf::from(v)),
            _ => std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
                .map(|d| d.join("wgpu-attention").join("tune.json")),
        };
        Self::at(path)
    }

    /// A cache stored at `path` (`None`: memory only).
    pub fn at(path: Option<PathBuf>) -> Self {
        let choices = path
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .and_then(|s| serde_json::from_str(&s).ok())
            .unwrap_or_default();
        TuneCache {
            path,
            choices: Mutex::new(choices),
        }
    }

    /// The file the choices are kept in (`None`: memory only). Compiled pipelines are kept
    /// in its directory, where the device has `Features::PIPELINE_CACHE`.
    pub fn path(&self) -> Option<&std::path::Path> {
        self.path.as_deref()
    }

    /// The directory the choices are kept in (`None`: memory only); the pipeline cache is
    /// kept there too.
    pub(crate) fn dir(&self) -> Option<&std::path::Path> {
        self.path.as_deref()?.parent()
    }

    /// Every key remembered (tests).
    #[cfg(test)]
    pub(crate) fn keys(&self) -> Vec<String> {
        let map = self.choices.lock().unwrap();
        map.keys().cloned().collect()
    }

    pub(crate) fn get<T: DeserializeOwned>(&self, key: &str) -> Option<T> {
        let map = self.choices.lock().ok()?;
        serde_json::from_value(map.get(key)?.clone()).ok()
    }

    /// Remembers `value`; writing the file is best effort (a read-only home only costs a
    /// re-measure next time).
    pub(crate) fn put<T: Serialize>(&self, key: &str, value: &T) {
        let Ok(v) = serde_json::to_value(value) else {
            return;
        };
        let Ok(mut map) = self.choices.lock() else {
            return;
        };
        map.insert(key.to_string(), v);
        if let Some(path) = &self.path {
            // Merge with what other processes wrote meanwhile.
            let mut on_disk: HashMap<String, serde_json::Value> = std::fs::read_to_string(path)
                .ok()
                .and_then(|s| serde_json::from_str(&s).ok())
                .unwrap_or_default();
            on_disk.extend(map.iter().map(|(k, v)| (k.clone(), v.clone())));
            if let Some(dir) = path.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            if let Ok(text) = serde_json::to_string_pretty(&on_disk) {
                // A file of this process's own: two processes tuning at once (CI runs two
                // verify sweeps side by side) must not write into one temporary file.
                let tmp = path.with_extension(format!("json.{}.tmp", std::process::id()));
                if std::fs::write(&tmp, text).is_ok() {
                    let _ = std::fs::rename(&tmp, path);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::variant::FlashVariant;

    #[test]
    fn cache_round_trips_through_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub").join("tune.json");
        let cache = TuneCache::at(Some(path.clone()));
        cache.put("k", &FlashVariant::Subgroup { rows_per_lane: 4 });
        let again = TuneCache::at(Some(path));
        assert_eq!(
            again.get::<FlashVariant>("k"),
            Some(FlashVariant::Subgroup { rows_per_lane: 4 })
        );
        assert_eq!(again.get::<FlashVariant>("missing"), None);
    }
}
