//! A group's rollout as a tick works on it: borrowed until something in it changes, then
//! copied — or, when the caller lends its rollouts ([`crate::tick_in_place`]), changed where
//! it lies, with a note that it changed.

use std::collections::BTreeMap;
use std::ops::Deref;

use crate::rollout::Rollout;
use crate::tick::GroupTick;

pub(crate) enum Held<'r> {
    /// Read only so far: most ticks change nothing in most groups.
    Borrowed(&'r Rollout),
    /// Copied on its first change, or begun by this tick.
    Owned(Rollout),
    /// The caller's own, changed in place; `changed` once anything was.
    Lent {
        rollout: &'r mut Rollout,
        changed: bool,
    },
}

impl Deref for Held<'_> {
    type Target = Rollout;

    fn deref(&self) -> &Rollout {
        match self {
            Held::Borrowed(r) => r,
            Held::Owned(r) => r,
            Held::Lent { rollout, .. } => rollout,
        }
    }
}

impl Held<'_> {
    /// The rollout to change: a borrowed one is copied first, a lent one marked changed.
    pub(crate) fn to_mut(&mut self) -> &mut Rollout {
        if let Held::Borrowed(r) = *self {
            *self = Held::Owned(r.clone());
        }
        match self {
            Held::Owned(r) => r,
            Held::Lent { rollout, changed } => {
                *changed = true;
                rollout
            }
            Held::Borrowed(_) => unreachable!("copied above"),
        }
    }
}

impl GroupTick<'_, '_> {
    /// [`GroupTick::run`] on the caller's rollouts, changed in place.
    pub(crate) fn run_in_place(mut self, rollouts: &mut BTreeMap<String, Rollout>) {
        match rollouts.get_mut(self.group) {
            Some(r) if r.state.is_active() => {
                let held = Held::Lent {
                    rollout: r,
                    changed: false,
                };
                if let Held::Lent { changed: true, .. } = self.drive(held) {
                    self.out.changed_in_place.insert(self.group.to_owned());
                }
            }
            previous => {
                let Some(begun) = self.new_rollout(previous.as_deref()) else {
                    return;
                };
                if let Held::Owned(begun) = self.drive(Held::Owned(begun)) {
                    rollouts.insert(self.group.to_owned(), begun);
                    self.out.changed_in_place.insert(self.group.to_owned());
                }
            }
        }
    }
}
