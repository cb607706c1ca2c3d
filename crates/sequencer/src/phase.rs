//! Phases, the phase-list builder and sequences.

use std::fmt;

use crate::kind::SequenceKind;
use crate::task::Task;

/// The deferred check of a phase: called when the phase is reached, skipping it on `false`.
pub type PhaseCheck<'a> = Box<dyn FnOnce() -> bool + Send + 'a>;

/// A named group of tasks that run concurrently. Ordering between things is expressed only by
/// putting them in different phases.
pub struct Phase<'a> {
    name: String,
    tasks: Vec<Task<'a>>,
    check: Option<PhaseCheck<'a>>,
}

impl<'a> Phase<'a> {
    /// A phase that always runs.
    pub fn new(name: impl Into<String>, tasks: impl IntoIterator<Item = Task<'a>>) -> Self {
        Self {
            name: name.into(),
            tasks: tasks.into_iter().collect(),
            check: None,
        }
    }

    /// A phase that runs only if `check` returns true when the phase is reached — it may
    /// depend on what earlier phases did (a loaded configuration, a detected install).
    pub fn deferred(
        name: impl Into<String>,
        check: impl FnOnce() -> bool + Send + 'a,
        tasks: impl IntoIterator<Item = Task<'a>>,
    ) -> Self {
        Self {
            check: Some(Box::new(check)),
            ..Self::new(name, tasks)
        }
    }

    /// The phase's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The phase's tasks.
    pub fn tasks(&self) -> &[Task<'a>] {
        &self.tasks
    }

    pub(crate) fn into_parts(self) -> (String, Vec<Task<'a>>, Option<PhaseCheck<'a>>) {
        (self.name, self.tasks, self.check)
    }
}

impl fmt::Debug for Phase<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Phase")
            .field("name", &self.name)
            .field("tasks", &self.tasks)
            .field("deferred_check", &self.check.is_some())
            .finish()
    }
}

/// Builds a phase list fluently, so mode- and state-specific variation is woven in phase by
/// phase instead of branching whole sequences.
///
/// ```
/// use slate_sequencer::{PhaseListBuilder, Task};
/// let container = false;
/// let phases = PhaseListBuilder::new()
///     .append("earlyServices", [Task::new("startApi", |_| Ok(()))])
///     .append_when(!container, "mountState", [Task::new("mountState", |_| Ok(()))])
///     .append_deferred("install", || false, [Task::new("install", |_| Ok(()))])
///     .build();
/// assert_eq!(phases.len(), 3);
/// ```
#[derive(Debug, Default)]
pub struct PhaseListBuilder<'a> {
    phases: Vec<Phase<'a>>,
}

impl<'a> PhaseListBuilder<'a> {
    /// An empty list.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a phase that always runs.
    pub fn append(
        mut self,
        name: impl Into<String>,
        tasks: impl IntoIterator<Item = Task<'a>>,
    ) -> Self {
        self.phases.push(Phase::new(name, tasks));
        self
    }

    /// Appends the phase only if `condition` holds now, at build time.
    pub fn append_when(
        self,
        condition: bool,
        name: impl Into<String>,
        tasks: impl IntoIterator<Item = Task<'a>>,
    ) -> Self {
        if condition {
            self.append(name, tasks)
        } else {
            self
        }
    }

    /// Appends a phase whose `check` is evaluated when the phase is reached (not now); the
    /// phase is skipped if it returns false.
    pub fn append_deferred(
        mut self,
        name: impl Into<String>,
        check: impl FnOnce() -> bool + Send + 'a,
        tasks: impl IntoIterator<Item = Task<'a>>,
    ) -> Self {
        self.phases.push(Phase::deferred(name, check, tasks));
        self
    }

    /// Appends an already built phase.
    pub fn append_phase(mut self, phase: Phase<'a>) -> Self {
        self.phases.push(phase);
        self
    }

    /// Appends every phase of `other`, in order (shared tails such as stop-services-then-reboot).
    pub fn append_list(mut self, other: PhaseListBuilder<'a>) -> Self {
        self.phases.extend(other.phases);
        self
    }

    /// The phases, in order.
    pub fn build(self) -> Vec<Phase<'a>> {
        self.phases
    }

    /// The phases as a sequence of `kind`.
    pub fn into_sequence(self, kind: SequenceKind) -> Sequence<'a> {
        Sequence::new(kind, self.phases)
    }
}

/// A kind plus its ordered phases; run it with [`Sequence::run`] or, under the lock, with
/// [`PriorityLock::run`](crate::PriorityLock::run).
pub struct Sequence<'a> {
    kind: SequenceKind,
    phases: Vec<Phase<'a>>,
}

impl<'a> Sequence<'a> {
    /// A sequence of `kind` made of `phases`.
    pub fn new(kind: SequenceKind, phases: Vec<Phase<'a>>) -> Self {
        Self { kind, phases }
    }

    /// The sequence's kind, which is also its name in logs.
    pub fn kind(&self) -> SequenceKind {
        self.kind
    }

    /// The phases, in order.
    pub fn phases(&self) -> &[Phase<'a>] {
        &self.phases
    }

    pub(crate) fn into_parts(self) -> (SequenceKind, Vec<Phase<'a>>) {
        (self.kind, self.phases)
    }
}

impl fmt::Debug for Sequence<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sequence")
            .field("kind", &self.kind)
            .field("phases", &self.phases)
            .finish()
    }
}
