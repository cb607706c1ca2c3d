//! The newest keys under a prefix: one bounded read, however many keys there are (the event
//! log is read this way, so `fleet events` costs the same whether etcd holds a day of events
//! or a month); and the keys under a prefix with their revisions but not their values (the
//! leader's check of which rollouts changed since it last read them).

use etcd_client::{Client, Error as EtcdError, GetOptions, SortOrder, SortTarget};

/// The most keys [`EtcdState::revisions`] answers (it lists one key per node group).
const MAX_REVISIONS: i64 = 100_000;

use super::{prefix_end, Entry, EtcdState, RawEntry, StateError, MAX_ANSWER};

impl EtcdState {
    /// The `limit` greatest keys that start with `key_prefix` (relative), oldest first.
    pub fn last(&self, key_prefix: &str, limit: usize) -> Result<Vec<Entry>, StateError> {
        let start = format!("{}{key_prefix}", self.shared.prefix);
        let from = start.clone().into_bytes();
        let limit = i64::try_from(limit.max(1)).unwrap_or(i64::MAX);
        let mut found = self.shared.run(
            || format!("reading the last {limit} keys under {start}"),
            move |client| read_last(client, from.clone(), limit),
        )?;
        found.reverse();
        let prefix = self.shared.prefix.as_bytes();
        found
            .into_iter()
            .map(|(key, value, mod_revision)| {
                let relative = key.strip_prefix(prefix).unwrap_or(&key);
                String::from_utf8(relative.to_vec())
                    .map(|key| Entry {
                        key,
                        value,
                        mod_revision,
                    })
                    .map_err(|_| {
                        self.shared.corrupt(
                            format!("reading the last keys under {start}"),
                            format!("key {} is not UTF-8", String::from_utf8_lossy(&key)),
                        )
                    })
            })
            .collect()
    }
}

impl EtcdState {
    /// Every key under `key_prefix` (relative, as [`EtcdState::list`] answers them) with its
    /// `mod_revision`, values left out; at most 100,000 keys.
    pub fn revisions(&self, key_prefix: &str) -> Result<Vec<(String, i64)>, StateError> {
        let end = prefix_end(format!("{}{key_prefix}", self.shared.prefix).as_bytes());
        self.revisions_from(key_prefix, end)
    }

    /// [`EtcdState::revisions`] of every key from `first` up to and including the keys under
    /// `last_prefix` (both relative), in one read: the leader learns whether the policies or
    /// any rollout moved with one request (`policies` sorts just before `rollouts/`).
    pub fn revisions_through(
        &self,
        first: &str,
        last_prefix: &str,
    ) -> Result<Vec<(String, i64)>, StateError> {
        let end = prefix_end(format!("{}{last_prefix}", self.shared.prefix).as_bytes());
        self.revisions_from(first, end)
    }

    fn revisions_from(&self, first: &str, end: Vec<u8>) -> Result<Vec<(String, i64)>, StateError> {
        let start = format!("{}{first}", self.shared.prefix);
        let from = start.clone().into_bytes();
        let found = self.shared.run(
            || format!("reading the revisions of the keys from {start}"),
            move |client| {
                let from = from.clone();
                let end = end.clone();
                async move {
                    let mut kv = client.kv_client();
                    let options = GetOptions::new()
                        .with_range(end)
                        .with_keys_only()
                        .with_limit(MAX_REVISIONS);
                    let resp = kv.get(from, Some(options)).await?;
                    Ok(resp
                        .kvs()
                        .iter()
                        .map(|kv| (kv.key().to_vec(), kv.mod_revision()))
                        .collect::<Vec<_>>())
                }
            },
        )?;
        let prefix = self.shared.prefix.as_bytes();
        found
            .into_iter()
            .map(|(key, revision)| {
                let relative = key.strip_prefix(prefix).unwrap_or(&key);
                String::from_utf8(relative.to_vec())
                    .map(|key| (key, revision))
                    .map_err(|_| {
                        self.shared.corrupt(
                            format!("reading the revisions of the keys from {start}"),
                            format!("key {} is not UTF-8", String::from_utf8_lossy(&key)),
                        )
                    })
            })
            .collect()
    }
}

/// Newest first: sorted by key, descending, at most `limit`.
async fn read_last(client: Client, start: Vec<u8>, limit: i64) -> Result<Vec<RawEntry>, EtcdError> {
    let end = prefix_end(&start);
    let mut kv = client.kv_client().max_decoding_message_size(MAX_ANSWER);
    let options = GetOptions::new()
        .with_range(end)
        .with_limit(limit)
        .with_sort(SortTarget::Key, SortOrder::Descend);
    let resp = kv.get(start, Some(options)).await?;
    Ok(resp
        .kvs()
        .iter()
        .map(|kv| (kv.key().to_vec(), kv.value().to_vec(), kv.mod_revision()))
        .collect())
}
