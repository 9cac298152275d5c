//! Background persistence of periodic checkpoints: the training thread takes a
//! snapshot into host memory (the only pause it sees) and hands it to one
//! persister thread, which runs the store's commit protocol while training
//! continues. One save at a time: a checkpoint falling due while one is in
//! flight is skipped (and logged), never queued behind it.

use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError};
use std::thread::JoinHandle;
use std::time::Instant;

use crate::checkpoint::{CheckpointError, CheckpointStore, SaveReport, Snapshot};

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

struct Job {
    snapshot: Snapshot,
    snapshot_seconds: f64,
}

/// The persister thread and its channels.
pub struct Persister {
    jobs: Option<SyncSender<Job>>,
    done: Receiver<Persisted>,
    handle: Option<JoinHandle<()>>,
    in_flight: Option<(u64, Instant)>,
}

impl Persister {
    /// Starts the thread that saves into `store`.
    pub fn spawn(store: CheckpointStore) -> std::io::Result<Persister> {
        let (jobs_tx, jobs_rx) = mpsc::sync_channel::<Job>(1);
        let (done_tx, done_rx) = mpsc::channel();
        let handle = std::thread::Builder::new().name("rekindle-persist".into()).spawn(move || {
            for job in jobs_rx {
                let step = job.snapshot.step;
                let payload_bytes = job.snapshot.payload_bytes();
                let result = store.save(&job.snapshot);
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
        Ok(Persister { jobs: Some(jobs_tx), done: done_rx, handle: Some(handle), in_flight: None })
    }

    /// True while a save is running.
    pub fn busy(&self) -> bool {
        self.in_flight.is_some()
    }

    /// Hands a snapshot to the thread. Call only when not [`busy`](Self::busy).
    pub fn submit(&mut self, snapshot: Snapshot, snapshot_seconds: f64) {
        debug_assert!(self.in_flight.is_none(), "one save at a time");
        self.in_flight = Some((snapshot.step, Instant::now()));
        if let Some(tx) = &self.jobs {
            // Capacity 1 and at most one in flight: never blocks.
            let _ = tx.send(Job { snapshot, snapshot_seconds });
        }
    }

    /// A finished save, if one completed since the last call (non-blocking).
    pub fn poll(&mut self) -> Option<Persisted> {
        match self.done.try_recv() {
            Ok(p) => {
                self.in_flight = None;
                Some(p)
            }
            Err(TryRecvError::Empty) | Err(TryRecvError::Disconnected) => None,
        }
    }

    /// Waits for the save in flight, if any.
    pub fn wait(&mut self) -> Option<Persisted> {
        self.in_flight?;
        let p = self.done.recv().ok();
        self.in_flight = None;
        p
    }
}

impl Drop for Persister {
    fn drop(&mut self) {
        self.jobs.take();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::{HostTensor, TensorSet};

    fn snap(step: u64) -> Snapshot {
        let mut model = TensorSet::new();
        model.insert("w".into(), HostTensor::from_f32(vec![4], &[step as f32; 4]));
        Snapshot { step, model, optimizer: TensorSet::new(), state: serde_json::json!({"step": step}) }
    }

    #[test]
    fn saves_in_the_background_one_at_a_time() {
        let tmp = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(tmp.path(), 3).unwrap();
        let mut p = Persister::spawn(store.clone()).unwrap();
        assert!(!p.busy());
        p.submit(snap(5), 0.0);
        assert!(p.busy());
        let done = p.wait().unwrap();
        assert_eq!(done.step, 5);
        assert!(done.result.is_ok());
        assert!(!p.busy());
        assert!(p.wait().is_none(), "nothing in flight");
        assert_eq!(store.load_latest().unwrap().loaded.unwrap().snapshot.step, 5);
    }
}
