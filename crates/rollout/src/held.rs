//! A group's rollout as a tick works on it: borrowed until something in it changes, then
//! copied — or, when the caller lends its rollouts ([`crate::tick_in_place`]), changed where
//! it lies, with a note that it changed.

use std::ops::Deref;

use crate::rollout::Rollout;

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
