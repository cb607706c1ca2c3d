//! The dirty runs of a [`SectorBuffer`](crate::SectorBuffer): byte runs keyed by the index of
//! their first sector, in a vector sorted by it.
//!
//! A buffer holds few runs (the FAT's two copies, a directory's entries, FSInfo) and looks one
//! up on every read and write `fatfs` makes — four or five per cluster of a file it writes, a
//! third of a million for a 256 MiB UKI. A `BTreeMap`'s range queries were a tenth of an
//! upgrade's user time (`perf` of `bench-apply`, docs/testing.md); a binary search over a
//! short vector is a few comparisons. Inserting and removing move the entries after the
//! place, which for a few dozen runs costs less than a tree's node allocation.

/// Runs keyed by first sector index, sorted and unique by key. Keeping them disjoint and
/// apart is the [`SectorBuffer`](crate::SectorBuffer)'s invariant, not this type's.
#[derive(Debug, Default)]
pub(crate) struct Runs(Vec<(u64, Vec<u8>)>);

impl Runs {
    /// How many runs start before sector `index`.
    fn before(&self, index: u64) -> usize {
        self.0.partition_point(|(first, _)| *first < index)
    }

    /// The last run starting before sector `index`, as (its first sector, its bytes).
    pub(crate) fn last_before(&self, index: u64) -> Option<(u64, &Vec<u8>)> {
        let i = self.before(index).checked_sub(1)?;
        let (first, run) = &self.0[i];
        Some((*first, run))
    }

    /// [`Runs::last_before`], mutably.
    pub(crate) fn last_before_mut(&mut self, index: u64) -> Option<(u64, &mut Vec<u8>)> {
        let i = self.before(index).checked_sub(1)?;
        let (first, run) = &mut self.0[i];
        Some((*first, run))
    }

    /// The runs starting at sectors `from..to`, in order.
    pub(crate) fn starting_in(
        &self,
        from: u64,
        to: u64,
    ) -> impl Iterator<Item = (u64, &[u8])> + Clone {
        let (start, stop) = (self.before(from), self.before(to));
        self.0[start..stop.max(start)]
            .iter()
            .map(|(first, run)| (*first, run.as_slice()))
    }

    /// The first sector of the first run starting at sector `index` or later.
    pub(crate) fn first_from(&self, index: u64) -> Option<u64> {
        self.0.get(self.before(index)).map(|(first, _)| *first)
    }

    /// Takes out the run starting at sector `index`, if there is one.
    pub(crate) fn remove(&mut self, index: u64) -> Option<Vec<u8>> {
        let i = self.before(index);
        (self.0.get(i).is_some_and(|(first, _)| *first == index)).then(|| self.0.remove(i).1)
    }

    /// The run starting at sector `index`, inserted empty if there is none.
    pub(crate) fn entry(&mut self, index: u64) -> &mut Vec<u8> {
        let i = self.before(index);
        if self.0.get(i).is_none_or(|(first, _)| *first != index) {
            self.0.insert(i, (index, Vec::new()));
        }
        &mut self.0[i].1
    }

    /// Every run, in order, leaving none.
    pub(crate) fn take(&mut self) -> Vec<(u64, Vec<u8>)> {
        std::mem::take(&mut self.0)
    }

    #[cfg(test)]
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, &Vec<u8>)> {
        self.0.iter().map(|(first, run)| (*first, run))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_by_first_sector() {
        let mut runs = Runs::default();
        runs.entry(10).extend_from_slice(b"ten");
        runs.entry(2).extend_from_slice(b"two");
        runs.entry(6).extend_from_slice(b"six");
        runs.entry(6).extend_from_slice(b"!");
        let firsts: Vec<u64> = runs.iter().map(|(first, _)| first).collect();
        assert_eq!(firsts, [2, 6, 10]);
        assert_eq!(runs.last_before(2), None);
        assert_eq!(runs.last_before(3), Some((2, &b"two".to_vec())));
        assert_eq!(runs.last_before(11).map(|(f, _)| f), Some(10));
        assert_eq!(
            runs.last_before_mut(7).map(|(f, r)| (f, r.len())),
            Some((6, 4))
        );
        let within: Vec<u64> = runs.starting_in(3, 10).map(|(f, _)| f).collect();
        assert_eq!(within, [6]);
        assert_eq!(runs.starting_in(7, 3).count(), 0);
        assert_eq!(runs.first_from(3), Some(6));
        assert_eq!(runs.first_from(11), None);
        assert_eq!(runs.remove(5), None);
        assert_eq!(runs.remove(6), Some(b"six!".to_vec()));
        assert_eq!(runs.take().len(), 2);
        assert_eq!(runs.first_from(0), None);
    }
}
