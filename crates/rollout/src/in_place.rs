//! The leader's tick on rollouts it lends ([`crate::tick_in_place`]): a group's rollout changed
//! where it lies, and a rollout begun by the tick put in the caller's map.

use std::collections::BTreeMap;

use crate::held::Held;
use crate::rollout::Rollout;
use crate::tick::GroupTick;

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
