//! Background persistence of periodic checkpoints: the training thread takes a
//! snapshot (the only pause it sees: tensors nothing writes into any more
//! are shared with it, the rest copied into host memory, see
//! `train::snapshot_tensors`) and hands it to one persister thread, which
//! runs the store's commit protocol while training continues. One save at a
//! time: a checkpoint falling due while one is in flight waits for it
//! (`run/saving.rs`), never queued behind it.
//!
//! The thread can die (a panic in the save path, or its channels closing).
//! That is never silent: [`Persister::poll`], [`Persister::wait`] and
//! [`Persister::submit`] report it as [`PersisterDied`] (with the panic's
//! message and the step that was in flight), and [`Persister::restart`]
//! starts a new thread on the same store. What the run does about it is the
//! caller's decision (`run/saving.rs`).
//!
//! A checkpoint whose optimizer state the ranks write in parts (ZeRO-1)
//! waits, before its manifest, for the other ranks' entries: the training
//! thread, which hears them in its rounds, hands them over
//! ([`Persister::deliver`]).

use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, Sender, SyncSender, TryRecvError};
use std::thread::JoinHandle;
use std::time::Instant;

use crate::{CheckpointError, CheckpointStore, ManifestEntry, Parts, SaveReport, Snapshot};

/// Whoever watches the background saves (in a run, the watchdog's
/// `attempt::Beats`, which turns a save that hangs into a requeue): told
/// when the save of a step begins, when it ends (the returned guard is
/// dropped) and which step it committed. A trait, so that the checkpointer
/// needs nothing of the attempt that runs it.
pub trait SaveWatch: Send + Sync {
    /// The save of `step` begins; it is over when the guard is dropped.
    fn save_begins(&self, step: u64) -> Box<dyn std::any::Any + Send>;
    /// The save of `step` committed.
    fn committed(&self, step: u64);
}

/// A [`SaveWatch`] that watches nothing (benchmarks, tools).
pub struct Unwatched;

impl SaveWatch for Unwatched {
    fn save_begins(&self, _step: u64) -> Box<dyn std::any::Any + Send> {
        Box::new(())
    }
    fn committed(&self, _step: u64) {}
}

/// The shared handle the persister thread reports to.
pub type Watch = Arc<dyn SaveWatch>;

/// A finished background save.
#[derive(Debug)]
pub struct Persisted {
    pub step: u64,
    pub payload_bytes: u64,
    pub snapshot_seconds: f64,
    pub result: Result<SaveReport, CheckpointError>,
    /// The snapshot's host buffers, handed back for the next snapshot to reuse.
    pub buffers: Option<Snapshot>,
}

/// The other ranks' entries for a checkpoint written in parts, or why they
/// will not come.
pub type PartEntries = Result<Vec<ManifestEntry>, PartsError>;

/// Why the other ranks' parts of a checkpoint will not come (the save is
/// abandoned: the previous checkpoint stands).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PartsError {
    /// A round of the ranks' agreement failed (the error, as text: it is
    /// the run's, which the checkpointer does not know).
    #[error("the ranks could not agree: {0}")]
    NoAgreement(String),
    /// These ranks did not report within `[distributed] timeout`.
    #[error(
        "rank(s) {} did not report their part within {waited_s:.0} s ([distributed] timeout): their storage or \
         the rank is stuck",
        ranks.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
    )]
    Overdue { ranks: Vec<usize>, waited_s: f64 },
    /// A rank reported that it could not write its part.
    #[error("rank {rank} could not write its part: {error}")]
    RankFailed { rank: usize, error: String },
    /// The run stopped waiting for them.
    #[error("the run stopped waiting for them (it is ending)")]
    Abandoned,
}

/// Where the ranks write a checkpoint in parts: the staging directory they
/// share, their number, and whether the optimizer state is in parts of
/// ranks (`store::Parts`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InParts {
    pub staging: String,
    pub world: usize,
    pub optimizer_in_parts: bool,
}

struct Job {
    snapshot: Snapshot,
    snapshot_seconds: f64,
    parts: Option<(InParts, Receiver<PartEntries>)>,
}

/// The persister thread is gone: the save in flight (if any) is lost.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the background checkpoint thread died ({error})")]
pub struct PersisterDied {
    /// The step whose save was in flight (or being handed over).
    pub step: Option<u64>,
    /// The panic's message, or why the thread is otherwise gone.
    pub error: String,
}

/// The persister thread and its channels.
pub struct Persister {
    store: CheckpointStore,
    watch: Watch,
    jobs: Option<SyncSender<Job>>,
    done: Receiver<Persisted>,
    handle: Option<JoinHandle<()>>,
    in_flight: Option<(u64, Instant)>,
    /// Where the other ranks' entries go, while the save in flight waits for them.
    parts: Option<Sender<PartEntries>>,
}

impl Persister {
    /// Starts the thread that saves into `store`; each save is reported to
    /// `watch` (in a run, the watchdog's view).
    pub fn spawn(store: CheckpointStore, watch: Watch) -> std::io::Result<Persister> {
        let (jobs, done, handle) = start_thread(store.clone(), watch.clone())?;
        Ok(Persister { store, watch, jobs: Some(jobs), done, handle: Some(handle), in_flight: None, parts: None })
    }

    /// Replaces a dead thread with a new one on the same store.
    pub fn restart(&mut self) -> std::io::Result<()> {
        let _ = self.reap();
        let (jobs, done, handle) = start_thread(self.store.clone(), self.watch.clone())?;
        (self.jobs, self.done, self.handle, self.in_flight, self.parts) = (Some(jobs), done, Some(handle), None, None);
        Ok(())
    }

    /// True while a save is running.
    pub fn busy(&self) -> bool {
        self.in_flight.is_some()
    }

    /// Hands a snapshot to the thread. Call only when not [`busy`](Self::busy).
    /// Fails when the thread is gone (the snapshot is dropped). With
    /// `parts`, the snapshot's optimizer state is rank 0's part and the
    /// save waits for the other ranks' entries ([`deliver`](Self::deliver)).
    pub fn submit(
        &mut self,
        snapshot: Snapshot,
        snapshot_seconds: f64,
        parts: Option<InParts>,
    ) -> Result<(), PersisterDied> {
        debug_assert!(self.in_flight.is_none(), "one save at a time");
        let step = snapshot.step;
        self.in_flight = Some((step, Instant::now()));
        let parts = parts.map(|spec| {
            let (tx, rx) = mpsc::channel();
            self.parts = Some(tx);
            (spec, rx)
        });
        let sent = match &self.jobs {
            // Capacity 1 and at most one in flight: never blocks.
            Some(tx) => tx.send(Job { snapshot, snapshot_seconds, parts }).is_ok(),
            None => false,
        };
        if sent { Ok(()) } else { Err(self.died()) }
    }

    /// True while the save in flight waits for the other ranks' entries.
    pub fn awaits_parts(&self) -> bool {
        self.parts.is_some()
    }

    /// The other ranks' entries (or why they will not come) for the save
    /// in flight, which then commits (or fails).
    pub fn deliver(&mut self, entries: PartEntries) {
        if let Some(tx) = self.parts.take() {
            // A thread that died no longer listens: `wait` reports it.
            let _ = tx.send(entries);
        }
    }

    /// A finished save, if one completed since the last call (non-blocking);
    /// an error when the thread died.
    pub fn poll(&mut self) -> Result<Option<Persisted>, PersisterDied> {
        match self.done.try_recv() {
            Ok(p) => {
                (self.in_flight, self.parts) = (None, None);
                Ok(Some(p))
            }
            Err(TryRecvError::Empty) => Ok(None),
            Err(TryRecvError::Disconnected) => Err(self.died()),
        }
    }

    /// Waits for the save in flight, if any; an error when the thread died.
    pub fn wait(&mut self) -> Result<Option<Persisted>, PersisterDied> {
        if self.in_flight.is_none() {
            return Ok(None);
        }
        match self.done.recv() {
            Ok(p) => {
                (self.in_flight, self.parts) = (None, None);
                Ok(Some(p))
            }
            Err(_) => Err(self.died()),
        }
    }

    /// The thread is gone: joins it for its panic message and forgets the
    /// save in flight. Later calls report it again until [`restart`](Self::restart).
    fn died(&mut self) -> PersisterDied {
        let step = self.in_flight.take().map(|(step, _)| step);
        self.parts = None;
        let error = self.reap().unwrap_or_else(|| "the thread is gone (its channel closed)".to_string());
        PersisterDied { step, error }
    }

    /// Joins the thread; the message of its panic, if it panicked.
    fn reap(&mut self) -> Option<String> {
        self.jobs.take();
        // A save waiting for the other ranks' entries gives up on them.
        self.parts.take();
        let payload = self.handle.take()?.join().err()?;
        Some(format!("panicked: {}", panic_message(&payload)))
    }
}

/// The message of a thread's panic, as `join` returns it.
pub fn panic_message(payload: &Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic payload".to_string())
}

type Started = (SyncSender<Job>, Receiver<Persisted>, JoinHandle<()>);

/// The thread and its two channels: jobs in (capacity 1), finished saves out.
fn start_thread(store: CheckpointStore, watch: Watch) -> std::io::Result<Started> {
    // Background saves may measure the write path (`write_mode.rs`): the
    // first large one pays for it, off the training thread; synchronous
    // saves (a stop's, inside its grace time) reuse what was measured.
    let store = store.with_write_measurement();
    {
        let (jobs_tx, jobs_rx) = mpsc::sync_channel::<Job>(1);
        let (done_tx, done_rx) = mpsc::channel();
        let handle = std::thread::Builder::new().name("rekindle-persist".into()).spawn(move || {
            for job in jobs_rx {
                let step = job.snapshot.step;
                let payload_bytes = job.snapshot.payload_bytes();
                let busy = watch.save_begins(step);
                // Tests make this thread die (`persist::before_save=panic`) or
                // hang (`=sleep(…)`) here.
                fail::fail_point!("persist::before_save");
                let result = match job.parts {
                    None => store.save(&job.snapshot),
                    Some((spec, entries)) => {
                        let mut collect = || entries.recv().unwrap_or(Err(PartsError::Abandoned));
                        let parts = Parts {
                            staging: spec.staging,
                            world: spec.world,
                            optimizer_in_parts: spec.optimizer_in_parts,
                            collect: &mut collect,
                        };
                        store.save_with(&job.snapshot, Some(parts))
                    }
                };
                drop(busy);
                if result.as_ref().map_or_else(CheckpointError::committed, |_| true) {
                    watch.committed(step);
                }
                let done = Persisted {
                    step,
                    payload_bytes,
                    snapshot_seconds: job.snapshot_seconds,
                    result,
                    buffers: Some(job.snapshot),
                };
                if done_tx.send(done).is_err() {
                    break;
                }
            }
        })?;
        Ok((jobs_tx, done_rx, handle))
    }
}

impl Drop for Persister {
    fn drop(&mut self) {
        let _ = self.reap();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{HostTensor, TensorSet};
    use std::sync::Mutex;

    /// What the persister reported, in order.
    #[derive(Default)]
    struct Recorder(Arc<Mutex<Vec<String>>>);

    struct Ends(u64, Arc<Mutex<Vec<String>>>);

    impl Drop for Ends {
        fn drop(&mut self) {
            self.1.lock().unwrap().push(format!("ends {}", self.0));
        }
    }

    impl SaveWatch for Recorder {
        fn save_begins(&self, step: u64) -> Box<dyn std::any::Any + Send> {
            self.0.lock().unwrap().push(format!("begins {step}"));
            Box::new(Ends(step, self.0.clone()))
        }
        fn committed(&self, step: u64) {
            self.0.lock().unwrap().push(format!("committed {step}"));
        }
    }

    fn snap(step: u64) -> Snapshot {
        let mut model = TensorSet::new();
        model.insert("w".into(), HostTensor::from_f32(vec![4], &[step as f32; 4]));
        Snapshot { step, model, optimizer: TensorSet::new(), state: serde_json::json!({"step": step}) }
    }

    #[test]
    fn saves_in_the_background_one_at_a_time() {
        let tmp = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(tmp.path(), 3).unwrap();
        let watch = Arc::new(Recorder::default());
        let mut p = Persister::spawn(store.clone(), watch.clone()).unwrap();
        assert!(!p.busy());
        p.submit(snap(5), 0.0, None).unwrap();
        assert!(p.busy());
        let done = p.wait().unwrap().unwrap();
        assert_eq!(done.step, 5);
        assert!(done.result.is_ok());
        assert!(!p.busy());
        assert!(p.wait().unwrap().is_none(), "nothing in flight");
        assert_eq!(store.load_latest().unwrap().loaded.unwrap().snapshot.step, 5);
        // The watchdog's view: the commit, reported by the persister itself.
        assert_eq!(*watch.0.lock().unwrap(), ["begins 5", "ends 5", "committed 5"]);
    }

    #[test]
    fn a_dead_thread_is_reported_with_its_panic_and_can_be_restarted() {
        let tmp = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(tmp.path(), 3).unwrap();
        let mut p = Persister::spawn(store.clone(), Arc::new(Unwatched)).unwrap();
        // Kill the thread as a panic would: replace it with one that panics.
        p.jobs.take();
        p.handle.take().unwrap().join().unwrap();
        let (jobs_tx, jobs_rx) = mpsc::sync_channel::<Job>(1);
        let (done_tx, done_rx) = mpsc::channel::<Persisted>();
        p.handle = Some(std::thread::spawn(move || {
            let _keep = (jobs_rx.recv(), done_tx);
            panic!("boom");
        }));
        (p.jobs, p.done) = (Some(jobs_tx), done_rx);
        p.submit(snap(7), 0.0, None).unwrap();
        let died = p.wait().unwrap_err();
        assert_eq!(died, PersisterDied { step: Some(7), error: "panicked: boom".into() });
        assert!(!p.busy());
        assert!(p.submit(snap(8), 0.0, None).is_err(), "still dead until restarted");
        p.restart().unwrap();
        p.submit(snap(9), 0.0, None).unwrap();
        assert_eq!(p.wait().unwrap().unwrap().step, 9);
        assert_eq!(store.load_latest().unwrap().loaded.unwrap().snapshot.step, 9);
    }
}
