//! How the first task of a world tells the others what they wait for (under
//! `exec`: the world record before their programs start, task 0's exit code
//! at the end, exec/world.rs) without every task re-reading files on the
//! shared filesystem ten times a second while it waits.
//!
//! ```text
//! task 0 (Board)    listens on a TCP port of its own (any free one) as soon
//!                   as it holds the run directory's lock, and writes where
//!                   (`.exec-leader.json`: launch, host, port and a random
//!                   token; mode 0600) into the staging directory once; a
//!                   connection is served only once it says the token
//!                   (nobody else who reaches the port hears anything or
//!                   puts a record anywhere), at most a task each and a few
//!                   spare; what task 0 posts goes into its file there,
//!                   then to every task connected and to each one that
//!                   connects later
//! a task (Link)     reads `.exec-leader.json` until it names this launch
//!                   (backing off from 100 ms to 1 s: task 0 writes it right
//!                   after taking the lock, before the slow part of its
//!                   start), connects, and then blocks on the connection: no
//!                   file is read while it is open, except a look at the
//!                   awaited file every SLOW_LOOK (10 s) in case the
//!                   connection is up but carries nothing (a partition)
//! fallback          no address, a refused connection, a closed one (task 0
//!                   gone or out of file descriptors), something unreadable
//!                   said: the task reads the awaited file itself, with the
//!                   same backoff
//! ```
//!
//! records           a task hands its `events.jsonl` records to task 0 over
//!                   the same connection (`{"relay": n, "line": …}`); task 0
//!                   appends whatever has come in, syncs once, and answers
//!                   `{"ack": n}` for each: one process appends to the file
//!                   where every task did (appends from many NFS clients are
//!                   not atomic), and a task's record is on stable storage
//!                   when it hears the ack. A refusal (`{"nack": n}`: not a
//!                   record, or task 0 cannot append), no ack within
//!                   RELAY_ACK (3 s: the task then leaves the connection),
//!                   or no connection: the task appends the record itself.
//!                   A task that finds task 0 lost leaves it for good
//!                   ([`Link::leave`]). Task 0, ending, appends and answers
//!                   what was relayed so far (at most FLUSH, 2 s) before
//!                   the connections close
//!
//! So a task's wait costs the shared filesystem a few opens while task 0
//! reaches its lock, then one every ten seconds, where it cost ten a second
//! for the whole wait (task 0 verifying a large checkpoint takes minutes;
//! `rekindle bench board` measures it, docs/scale.md). Task 0 writes each
//! message to its file before it says it: a task that sees the connection
//! close finds the file in place.
//!
//! A JSON line a message (`{"file": …, "body": …}`); a task takes only
//! messages of its own launch ([`Posted::launch`]), never a line over
//! [`MAX_LINE`] bytes.

use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tokio::sync::mpsc::UnboundedSender;

use serde::{Deserialize, Serialize};

use crate::attempt::error::RunError;

/// Where task 0 listens, in the staging directory.
pub const ADDRESS_FILE: &str = ".exec-leader.json";

/// The first wait between two looks at the files, doubled up to [`MAX_GAP`].
const FIRST_GAP: Duration = Duration::from_millis(100);
const MAX_GAP: Duration = Duration::from_secs(1);
/// How long a read on the connection blocks before the wait looks at its
/// stop, its loss check and its deadline (in memory, no file).
const READ_TICK: Duration = Duration::from_millis(100);
/// While connected, how often the awaited file is read anyway.
#[cfg(not(test))]
const SLOW_LOOK: Duration = Duration::from_secs(10);
#[cfg(test)]
const SLOW_LOOK: Duration = Duration::from_millis(600);
/// The longest message line taken (a world record is under 2 KiB).
pub const MAX_LINE: usize = 1 << 20;
/// How long a connect or a write to task 0 may block.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a task waits for task 0 to say a relayed record is on stable
/// storage before it writes the record itself (and leaves the connection:
/// the next records do not wait again).
const RELAY_ACK: Duration = Duration::from_secs(3);
/// File descriptors task 0 keeps free besides one a connected task.
const SPARE_FDS: u64 = 256;

/// `.exec-leader.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Address {
    launch: String,
    host: String,
    port: u16,
    /// What a task says first (module header).
    token: String,
}

/// What a board posts: a record with a file of its own in the staging
/// directory, naming the launch it belongs to.
pub trait Posted: Serialize + for<'a> Deserialize<'a> {
    /// Its file's name in the staging directory.
    const FILE: &'static str;
    /// The launch it belongs to.
    fn launch(&self) -> &str;
}

/// One line on the connection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    file: String,
    body: serde_json::Value,
}

fn read_json<T: for<'a> Deserialize<'a>>(path: &Path) -> Option<T> {
    let bytes = crate::confine::read_bounded(path, MAX_LINE as u64).ok()?;
    serde_json::from_slice(&bytes).ok()
}

fn write_json(path: &Path, value: &impl Serialize) -> Result<(), RunError> {
    let bytes = serde_json::to_vec(value).expect("a world message serialises");
    crate::rundir::write_atomically(path, &bytes)
        .map_err(|source| RunError::RunDir { path: path.to_path_buf(), source })
}

/// What task 0 said so far (for the tasks that connect later), and a queue
/// to each connected task's writer.
#[derive(Default)]
struct Said {
    lines: Vec<Arc<[u8]>>,
    peers: Vec<UnboundedSender<Arc<[u8]>>>,
}

impl Said {
    /// Queues `line` for every peer; one whose writer ended is dropped.
    fn say(&mut self, line: &Arc<[u8]>) {
        self.peers.retain(|p| p.send(Arc::clone(line)).is_ok());
    }
}

/// A task's first line: the launch's token from `.exec-leader.json` (a file
/// only the user can read), so that nobody else who reaches the port is
/// served, or can put a record into events.jsonl.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Hello {
    hello: String,
}

/// A record a task relays through task 0 (`{"relay": seq, "line": …}`), and
/// task 0's answer: `{"ack": seq}` once it is on stable storage, `{"nack":
/// seq}` when task 0 does not take it (the task writes it itself).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Relayed {
    relay: u64,
    line: serde_json::Value,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Ack {
    ack: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Nack {
    nack: u64,
}

/// A line from task 0: a post, an acknowledgement or a refusal.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
enum FromBoard {
    Post(Line),
    Ack(Ack),
    Nack(Nack),
}

/// Task 0's side (module header).
pub struct Board {
    staging: PathBuf,
    launch: String,
    said: Option<Arc<Mutex<Said>>>,
    done: Arc<Notify>,
    /// Says the serving thread has ended (its records appended and acked).
    finished: Option<std::sync::mpsc::Receiver<()>>,
    port: Option<u16>,
}

/// What the serving thread shares with each connection.
struct Serving {
    said: Arc<Mutex<Said>>,
    token: String,
    /// The appender of relayed records (none: every relay is refused).
    appender: Option<std::sync::mpsc::Sender<ToAppend>>,
    /// Relayed records not yet acked or refused.
    pending: Arc<AtomicUsize>,
    /// Connections open, and the most served at once (a task each, and a
    /// few spare for reconnections).
    peers: AtomicUsize,
    max_peers: usize,
}

impl Board {
    /// Listens for the `size - 1` other tasks of `launch` and says where in
    /// `staging`; appends the records they relay to `relay_to` (their
    /// `events.jsonl` lines), when given. Where it cannot listen (no port,
    /// too few file descriptors, the file not written), the others read the
    /// files and write their own records, and this is logged.
    pub fn open(staging: &Path, launch: &str, host: &str, size: usize, relay_to: Option<&Path>) -> Board {
        let mut board = Board {
            staging: staging.to_path_buf(),
            launch: launch.to_string(),
            said: None,
            done: Arc::default(),
            finished: None,
            port: None,
        };
        if let Err(why) = board.listen(host, size, relay_to.map(Path::to_path_buf)) {
            tracing::warn!(
                "task 0 does not serve the other tasks over TCP ({why}): they read its records from {} instead",
                staging.display()
            );
        }
        board
    }

    fn listen(&mut self, host: &str, size: usize, relay_to: Option<PathBuf>) -> Result<(), String> {
        enough_descriptors(size as u64 + SPARE_FDS)?;
        let token = new_token();
        let listener = TcpListener::bind(("0.0.0.0", 0)).map_err(|e| format!("no TCP port to listen on: {e}"))?;
        let port = listener.local_addr().map_err(|e| format!("the port it bound: {e}"))?.port();
        listener.set_nonblocking(true).map_err(|e| format!("a non-blocking listener: {e}"))?;
        let said: Arc<Mutex<Said>> = Arc::default();
        let pending: Arc<AtomicUsize> = Arc::default();
        // Appends and syncs on a thread of its own: a slow sync of the
        // shared filesystem never holds the connections up.
        let appender = match relay_to {
            Some(path) => {
                let (tx, rx) = std::sync::mpsc::channel::<ToAppend>();
                let pending = Arc::clone(&pending);
                std::thread::Builder::new()
                    .name("exec-board-append".into())
                    .spawn(move || append_relayed(&path, &rx, &pending))
                    .map_err(|e| format!("no thread to append records on: {e}"))?;
                Some(tx)
            }
            None => None,
        };
        let serving = Arc::new(Serving {
            said: Arc::clone(&said),
            token: token.clone(),
            appender,
            pending,
            peers: AtomicUsize::new(0),
            max_peers: size + 16,
        });
        // One thread, its own runtime: the tasks' connections, each a reader
        // and a writer task.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| format!("no runtime to serve with: {e}"))?;
        let done = Arc::clone(&self.done);
        let (finished_tx, finished_rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("exec-board".into())
            .spawn(move || {
                runtime.block_on(serve(listener, serving, done));
                drop(runtime);
                let _ = finished_tx.send(());
            })
            .map_err(|e| format!("no thread to serve on: {e}"))?;
        self.said = Some(said);
        self.finished = Some(finished_rx);
        self.port = Some(port);
        let address = Address { launch: self.launch.clone(), host: host.to_string(), port, token };
        write_private(&self.staging, ADDRESS_FILE, &address)
            .map_err(|e| format!("cannot write {}: {e}", self.staging.join(ADDRESS_FILE).display()))
    }

    /// The port this task listens on, when it does.
    pub fn port(&self) -> Option<u16> {
        self.port
    }

    /// `value`: into its file, then to every task connected.
    pub fn post<T: Posted>(&self, value: &T) -> Result<(), RunError> {
        write_json(&self.staging.join(T::FILE), value)?;
        let Some(said) = &self.said else { return Ok(()) };
        let line = Line { file: T::FILE.to_string(), body: serde_json::to_value(value).expect("a post serialises") };
        let line: Arc<[u8]> = json_line(&line).into();
        let mut said = said.lock().unwrap_or_else(PoisonError::into_inner);
        said.say(&line);
        said.lines.push(line);
        Ok(())
    }
}

impl Drop for Board {
    /// Stops serving: no new connection; the records relayed so far are
    /// appended and acked (at most [`FLUSH`]); then the connections close (a
    /// task still waiting reads the files).
    fn drop(&mut self) {
        self.done.notify_one();
        if let Some(finished) = &self.finished {
            let _ = finished.recv_timeout(FLUSH + Duration::from_secs(1));
        }
    }
}

/// How long task 0, ending, lets the records relayed so far be appended
/// and their acks reach the tasks.
const FLUSH: Duration = Duration::from_secs(2);
/// How long a task that connects has to say the launch's token.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

fn json_line(value: &impl Serialize) -> Vec<u8> {
    let mut line = serde_json::to_vec(value).expect("a board line serialises");
    line.push(b'\n');
    line
}

/// A random token, as hex (rand's thread generator: a CSPRNG seeded by the
/// operating system).
fn new_token() -> String {
    let bytes: [u8; 16] = rand::random();
    hex::encode(bytes)
}

/// Writes `value` as `name` in `dir` whole (a temporary name renamed),
/// readable by the user alone: the address file carries the launch's token.
/// Through the directory's handle, never following a link.
fn write_private(dir: &Path, name: &str, value: &impl Serialize) -> std::io::Result<()> {
    let dir = crate::confine::Dir::open(dir)?;
    let tmp = format!(".{name}.{}.tmp", std::process::id());
    let _ = dir.remove_file(&tmp);
    let mut file = dir.create_new(&tmp, 0o600)?;
    file.write_all(&serde_json::to_vec(value).expect("an address serialises"))?;
    file.sync_all()?;
    dir.rename(&tmp, name)
}

/// A relayed record on its way to the appender, with the queue its answer
/// goes back on.
type ToAppend = (serde_json::Value, u64, UnboundedSender<Arc<[u8]>>);

/// The accept loop: each task that connects and says the token hears what
/// was said so far. Once `done`: no new connection, and the records relayed
/// so far are appended and answered (at most [`FLUSH`]).
async fn serve(listener: TcpListener, serving: Arc<Serving>, done: Arc<Notify>) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => return tracing::warn!(error = %e, "task 0 cannot serve the other tasks; they read the files"),
    };
    let mut logged = false;
    loop {
        let accepted = tokio::select! {
            _ = done.notified() => break,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            // Over the bound, the connection closes at once: the task reads
            // the files.
            Ok((peer, _)) if serving.peers.load(Ordering::SeqCst) < serving.max_peers => {
                serving.peers.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(serve_peer(peer, Arc::clone(&serving)));
            }
            Ok(_) => {}
            Err(e) => {
                if !logged {
                    tracing::warn!(error = %e, "task 0 could not accept a task's connection; that task reads the files");
                    logged = true;
                }
                tokio::time::sleep(READ_TICK).await;
            }
        }
    }
    drop(listener);
    let until = Instant::now() + FLUSH;
    while serving.pending.load(Ordering::SeqCst) > 0 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The writers send the last answers.
    tokio::time::sleep(Duration::from_millis(50)).await;
}

/// One line from `reader`, at most [`MAX_LINE`] bytes; `None` at the end of
/// the connection, on an error, or past the limit.
async fn read_line<R: tokio::io::AsyncBufRead + Unpin>(reader: &mut R) -> Option<Vec<u8>> {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt};
    let mut line = Vec::new();
    match reader.take(MAX_LINE as u64 + 1).read_until(b'\n', &mut line).await {
        Ok(_) if line.ends_with(b"\n") => Some(line),
        _ => None,
    }
}

/// One task's connection: its token first; then what was said, and each new
/// post and answer, out; its relayed records in. Something unreadable from
/// it ends it.
async fn serve_peer(peer: tokio::net::TcpStream, serving: Arc<Serving>) {
    use tokio::io::AsyncWriteExt;
    let _ = peer.set_nodelay(true);
    let (reader, mut writer) = peer.into_split();
    let mut reader = tokio::io::BufReader::new(reader);
    let hello = tokio::time::timeout(HELLO_TIMEOUT, read_line(&mut reader)).await.ok().flatten();
    let said_token =
        hello.and_then(|l| serde_json::from_slice::<Hello>(&l).ok()).is_some_and(|h| h.hello == serving.token);
    if said_token {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Arc<[u8]>>();
        {
            let mut said = serving.said.lock().unwrap_or_else(PoisonError::into_inner);
            for line in &said.lines {
                let _ = tx.send(Arc::clone(line));
            }
            said.peers.push(tx.clone());
        }
        let writing = tokio::spawn(async move {
            while let Some(line) = rx.recv().await {
                if writer.write_all(&line).await.is_err() {
                    return;
                }
            }
        });
        read_peer(&mut reader, &tx, &serving).await;
        // The connection closes with its write half: the task reads the files.
        writing.abort();
    } else {
        tracing::warn!("a connection to task 0's port did not say this launch's token; closed");
    }
    serving.peers.fetch_sub(1, Ordering::SeqCst);
}

/// A task's relayed records, to the appender, until its connection ends or
/// it says something unreadable.
async fn read_peer<R: tokio::io::AsyncBufRead + Unpin>(
    reader: &mut R,
    tx: &UnboundedSender<Arc<[u8]>>,
    serving: &Serving,
) {
    loop {
        let Some(line) = read_line(reader).await else { return };
        let Some(relayed) = serde_json::from_slice::<Relayed>(&line).ok() else {
            tracing::warn!(
                "a task said something unreadable to task 0, or a line over {MAX_LINE} bytes; its connection is closed"
            );
            return;
        };
        let taken = crate::telemetry::RecordedEvent::from_value(relayed.line.clone()).is_some()
            && serving.appender.as_ref().is_some_and(|appender| {
                serving.pending.fetch_add(1, Ordering::SeqCst);
                let sent = appender.send((relayed.line, relayed.relay, tx.clone())).is_ok();
                if !sent {
                    serving.pending.fetch_sub(1, Ordering::SeqCst);
                }
                sent
            });
        if !taken {
            // Not a record of events.jsonl, or no appender: the task writes
            // it itself, at once.
            let _ = tx.send(json_line(&Nack { nack: relayed.relay }).into());
        }
    }
}

/// Appends the relayed records to `path`, as many as are waiting at a time,
/// one sync for them all, then acks each: a task's record is on stable
/// storage when it hears the ack. Where they cannot be written, each is
/// refused (`nack`) and its task writes it itself (a record appended before
/// a failed sync may then be there twice).
fn append_relayed(path: &Path, rx: &std::sync::mpsc::Receiver<ToAppend>, pending: &AtomicUsize) {
    let mut writer: Option<crate::telemetry::JsonlWriter> = None;
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while let Ok(more) = rx.try_recv() {
            batch.push(more);
        }
        if writer.is_none() {
            writer = crate::telemetry::JsonlWriter::open(path)
                .map_err(|e| tracing::error!(error = %e, "task 0 cannot append the other tasks' records; they write their own"))
                .ok();
        }
        let written = writer.as_mut().is_some_and(|w| {
            let appended = batch.iter().try_for_each(|(line, _, _)| w.append(line)).and_then(|()| w.sync());
            appended.map_err(|e| tracing::error!(error = %e, "task 0 could not append the other tasks' records; they write their own")).is_ok()
        });
        if !written {
            writer = None;
        }
        let n = batch.len();
        for (_, seq, to) in batch {
            let answer = if written { json_line(&Ack { ack: seq }) } else { json_line(&Nack { nack: seq }) };
            let _ = to.send(answer.into());
        }
        pending.fetch_sub(n, Ordering::SeqCst);
    }
}

/// Raises this process's soft limit on open files to `needed` where the hard
/// limit allows; an error says why task 0 cannot hold a connection a task.
fn enough_descriptors(needed: u64) -> Result<(), String> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(|e| format!("the open-file limit: {e}"))?;
    if soft >= needed {
        return Ok(());
    }
    if hard < needed {
        return Err(format!("{needed} open files needed, the hard limit is {hard} (ulimit -Hn)"));
    }
    setrlimit(Resource::RLIMIT_NOFILE, needed, hard)
        .map_err(|e| format!("raising the open-file limit to {needed}: {e}"))
}

/// A task's link, shared by its waits and its event log (records relayed
/// through task 0, [`Link::relay`]).
#[derive(Clone)]
pub struct SharedLink(Arc<Mutex<Link>>);

impl SharedLink {
    pub fn new(link: Link) -> SharedLink {
        SharedLink(Arc::new(Mutex::new(link)))
    }

    /// The link, for one wait (not held across a record: the event log
    /// takes it too).
    pub fn lock(&self) -> std::sync::MutexGuard<'_, Link> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl crate::telemetry::Relay for SharedLink {
    fn relay(&mut self, line: &serde_json::Value) -> bool {
        self.lock().relay(line)
    }
}

/// What a task's wait ended with.
#[derive(Debug)]
pub enum Waited<T, Q> {
    /// The awaited message.
    Got(T),
    /// `quit` said to stop waiting.
    Quit(Q),
}

/// A task's side (module header): one for the whole launch, so the
/// connection made for the record also carries the end.
pub struct Link {
    staging: PathBuf,
    launch: String,
    conn: Option<BufReader<TcpStream>>,
    partial: Vec<u8>,
    /// What task 0 said, by file.
    heard: std::collections::BTreeMap<String, serde_json::Value>,
    gap: Duration,
    next_look: Instant,
    file_reads: u64,
    /// A task 0 address that said something unreadable: not connected to
    /// again (whatever listens there is not this launch's task 0).
    shunned: Option<(String, u16)>,
    /// The address connected to.
    peer: Option<(String, u16)>,
    /// The last record relayed, and the last task 0 said is stored.
    relayed: u64,
    acked: u64,
    nacked: u64,
}

impl Link {
    pub fn new(staging: &Path, launch: &str) -> Link {
        Link {
            staging: staging.to_path_buf(),
            launch: launch.to_string(),
            conn: None,
            partial: Vec::new(),
            heard: Default::default(),
            gap: FIRST_GAP,
            next_look: Instant::now(),
            file_reads: 0,
            shunned: None,
            peer: None,
            relayed: 0,
            acked: 0,
            nacked: 0,
        }
    }

    /// The staging directory whose files this task falls back to.
    pub fn staging(&self) -> &Path {
        &self.staging
    }

    /// Files of the shared filesystem this task has read so far (the
    /// benchmark and the tests count them).
    pub fn file_reads(&self) -> u64 {
        self.file_reads
    }

    /// The records task 0 has acknowledged so far ([`Link::relay`]).
    pub fn acked(&self) -> u64 {
        self.acked
    }

    /// Whether the connection to task 0 is open.
    pub fn connected(&self) -> bool {
        self.conn.is_some()
    }

    /// Waits for task 0's `T` of this launch until `deadline`, or until
    /// `quit` returns something (asked every [`READ_TICK`], in memory);
    /// `None` past the deadline.
    pub fn wait<T: Posted, Q>(&mut self, deadline: Instant, quit: &dyn Fn() -> Option<Q>) -> Option<Waited<T, Q>> {
        let path = self.staging.join(T::FILE);
        loop {
            if let Some(value) = self.heard::<T>() {
                return Some(Waited::Got(value));
            }
            if Instant::now() >= self.next_look {
                // Connected first: task 0 names its port before it writes
                // any record, so a task that finds the record in the file
                // holds the connection too (for its own records, and the
                // end), whatever its timing.
                if self.conn.is_none() {
                    self.connect();
                }
                self.file_reads += 1;
                if let Some(value) = read_json::<T>(&path).filter(|v| v.launch() == self.launch) {
                    self.next_look = Instant::now() + if self.conn.is_some() { SLOW_LOOK } else { self.gap };
                    return Some(Waited::Got(value));
                }
                self.next_look = Instant::now() + if self.conn.is_some() { SLOW_LOOK } else { self.gap };
                self.gap = (self.gap * 2).min(MAX_GAP);
            }
            if let Some(q) = quit() {
                return Some(Waited::Quit(q));
            }
            if Instant::now() >= deadline {
                return None;
            }
            if self.conn.is_some() {
                self.read_messages();
            } else {
                let left = self.next_look.min(deadline).saturating_duration_since(Instant::now());
                std::thread::sleep(left.min(READ_TICK));
            }
        }
    }

    /// Task 0's `T` of this launch, when it said one.
    fn heard<T: Posted>(&self) -> Option<T> {
        let body = self.heard.get(T::FILE)?;
        serde_json::from_value::<T>(body.clone()).ok().filter(|v| v.launch() == self.launch)
    }

    /// Hands `line` (an `events.jsonl` record) to task 0 to append, and waits
    /// until task 0 says it is on stable storage (at most [`RELAY_ACK`]):
    /// `false` when it is not known to be (not connected, the connection
    /// broke, no ack in time), and the caller writes it itself. Only a task 0
    /// that stored the record but died before its ack arrived makes that a
    /// second copy.
    pub fn relay(&mut self, line: &serde_json::Value) -> bool {
        let Some(conn) = self.conn.as_mut() else { return false };
        self.relayed += 1;
        let seq = self.relayed;
        let bytes = json_line(&Relayed { relay: seq, line: line.clone() });
        if conn.get_mut().write_all(&bytes).is_err() {
            self.disconnect();
            return false;
        }
        let until = Instant::now() + RELAY_ACK;
        while self.acked < seq {
            if self.nacked >= seq || self.conn.is_none() {
                return false;
            }
            if Instant::now() >= until {
                tracing::warn!(
                    seq,
                    "task 0 did not store this task's record in time: writing it here, and no more through task 0 on this connection"
                );
                self.disconnect();
                return false;
            }
            self.read_messages();
        }
        true
    }

    /// Leaves task 0 for good: found lost, it neither takes this task's
    /// records (they would wait for an ack that cannot come) nor is
    /// connected to again.
    pub fn leave(&mut self) {
        self.shunned = self.peer.take().or(self.shunned.take());
        self.conn = None;
        self.partial.clear();
    }

    /// Reads task 0's address and connects, where it names this launch.
    fn connect(&mut self) {
        self.file_reads += 1;
        let Some(address) = read_json::<Address>(&self.staging.join(ADDRESS_FILE)) else { return };
        if address.launch != self.launch || self.shunned == Some((address.host.clone(), address.port)) {
            return;
        }
        let addrs = match (address.host.as_str(), address.port).to_socket_addrs() {
            Ok(addrs) => addrs.collect::<Vec<_>>(),
            Err(e) => {
                tracing::warn!(host = %address.host, error = %e, "task 0's host does not resolve: reading its records from the files");
                return;
            }
        };
        for addr in addrs {
            let hello = json_line(&Hello { hello: address.token.clone() });
            if let Ok(mut stream) = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)
                && stream.set_read_timeout(Some(READ_TICK)).is_ok()
                && stream.set_write_timeout(Some(WRITE_TIMEOUT)).is_ok()
                && stream.write_all(&hello).is_ok()
            {
                tracing::debug!(%addr, "connected to task 0");
                self.conn = Some(BufReader::new(stream));
                self.partial.clear();
                self.peer = Some((address.host.clone(), address.port));
                return;
            }
        }
    }

    /// Takes what task 0 said within one [`READ_TICK`]; a closed or broken
    /// connection (task 0 gone) sends this task back to the files at once.
    fn read_messages(&mut self) {
        let Some(conn) = self.conn.as_mut() else { return };
        // What the socket holds, read through the buffer a piece at a time,
        // so that a line is never held past MAX_LINE.
        let (taken, line_ends) = match conn.fill_buf() {
            Ok([]) => return self.disconnect(),
            Ok(bytes) => match bytes.iter().position(|b| *b == b'\n') {
                Some(at) => (&bytes[..=at], true),
                None => (bytes, false),
            },
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {
                return;
            }
            Err(_) => return self.disconnect(),
        };
        self.partial.extend_from_slice(taken);
        let n = taken.len();
        conn.consume(n);
        if self.partial.len() > MAX_LINE {
            tracing::warn!("task 0's port said a line over {MAX_LINE} bytes: reading the files");
            self.shunned = self.peer.take();
            return self.disconnect();
        }
        if !line_ends {
            return;
        }
        let line = std::mem::take(&mut self.partial);
        match serde_json::from_slice::<FromBoard>(&line) {
            Ok(FromBoard::Post(line)) => {
                self.heard.insert(line.file, line.body);
            }
            Ok(FromBoard::Ack(ack)) => self.acked = self.acked.max(ack.ack),
            Ok(FromBoard::Nack(nack)) => self.nacked = self.nacked.max(nack.nack),
            Err(e) => {
                tracing::warn!(error = %e, "task 0's port said something unreadable: reading the files");
                self.shunned = self.peer.take();
                self.disconnect();
            }
        }
    }

    fn disconnect(&mut self) {
        self.conn = None;
        self.partial.clear();
        self.gap = FIRST_GAP;
        self.next_look = Instant::now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// What the tests post: a start and an end.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Go {
        launch: String,
        step: u64,
    }
    impl Posted for Go {
        const FILE: &'static str = ".go.json";
        fn launch(&self) -> &str {
            &self.launch
        }
    }
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Bye {
        launch: String,
        code: u8,
    }
    impl Posted for Bye {
        const FILE: &'static str = ".bye.json";
        fn launch(&self) -> &str {
            &self.launch
        }
    }

    fn go(launch: &str) -> Go {
        Go { launch: launch.into(), step: 40 }
    }

    fn bye(launch: &str, code: u8) -> Bye {
        Bye { launch: launch.into(), code }
    }

    /// A port of the test's own, named as task 0's of `launch` in `staging`.
    fn fake_task_0(staging: &Path, launch: &str) -> TcpListener {
        let listener = TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let port = listener.local_addr().unwrap().port();
        let address = Address { launch: launch.into(), host: "127.0.0.1".into(), port, token: "t".into() };
        write_json(&staging.join(ADDRESS_FILE), &address).unwrap();
        listener
    }

    fn never() -> Option<()> {
        None
    }

    fn within(secs: u64) -> Instant {
        Instant::now() + Duration::from_secs(secs)
    }

    fn got<T: std::fmt::Debug, Q: std::fmt::Debug>(w: Option<Waited<T, Q>>) -> T {
        match w {
            Some(Waited::Got(v)) => v,
            other => panic!("expected the message, got {other:?}"),
        }
    }

    #[test]
    fn tasks_hear_both_posts_over_the_connection_without_rereading_files() {
        let tmp = tempfile::tempdir().unwrap();
        let board = Board::open(tmp.path(), "42.0.r0", "localhost", 9, None);
        assert!(board.port().is_some(), "task 0 listens");
        let staging = tmp.path().to_path_buf();
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let staging = staging.clone();
                std::thread::spawn(move || {
                    let mut link = Link::new(&staging, "42.0.r0");
                    let first: Go = got(link.wait(within(20), &never));
                    let last: Bye = got(link.wait(within(20), &never));
                    (first, last, link.file_reads())
                })
            })
            .collect();
        // Task 0 takes its time: a task polling every 100 ms would read the
        // files ~18 times meanwhile.
        std::thread::sleep(Duration::from_millis(1500));
        board.post(&go("42.0.r0")).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        board.post(&bye("42.0.r0", 75)).unwrap();
        for task in tasks {
            let (first, last, reads) = task.join().unwrap();
            assert_eq!((first, last), (go("42.0.r0"), bye("42.0.r0", 75)));
            // A look at each file and at the address, and a few slow looks
            // (every 0.6 s here, every 10 s in the product).
            assert!(reads <= 7, "{reads} file reads");
        }
        // Both are in the files as well.
        assert_eq!(read_json::<Go>(&tmp.path().join(Go::FILE)), Some(go("42.0.r0")));
        assert_eq!(read_json::<Bye>(&tmp.path().join(Bye::FILE)), Some(bye("42.0.r0", 75)));
    }

    #[test]
    fn a_task_that_connects_late_hears_what_was_said() {
        let tmp = tempfile::tempdir().unwrap();
        let board = Board::open(tmp.path(), "1.0.r0", "localhost", 2, None);
        board.post(&go("1.0.r0")).unwrap();
        board.post(&bye("1.0.r0", 0)).unwrap();
        // The files go: only the connection can tell now.
        std::fs::remove_file(tmp.path().join(Go::FILE)).unwrap();
        std::fs::remove_file(tmp.path().join(Bye::FILE)).unwrap();
        let mut link = Link::new(tmp.path(), "1.0.r0");
        assert_eq!(got(link.wait::<Go, ()>(within(10), &never)), go("1.0.r0"));
        assert_eq!(got(link.wait::<Bye, ()>(within(10), &never)), bye("1.0.r0", 0));
    }

    #[test]
    fn without_task_0_a_task_reads_the_files_and_takes_only_its_launchs() {
        let tmp = tempfile::tempdir().unwrap();
        write_json(&tmp.path().join(Go::FILE), &go("42.0.r0")).unwrap();
        // A stale address of the previous launch is not followed.
        let stale = Address { launch: "42.0.r0".into(), host: "localhost".into(), port: 1, token: "t".into() };
        write_json(&tmp.path().join(ADDRESS_FILE), &stale).unwrap();
        let mut link = Link::new(tmp.path(), "42.0.r1");
        let started = Instant::now();
        assert!(link.wait::<Go, ()>(Instant::now() + Duration::from_millis(400), &never).is_none());
        assert!(started.elapsed() >= Duration::from_millis(400));
        assert!(!link.connected());
        write_json(&tmp.path().join(Go::FILE), &go("42.0.r1")).unwrap();
        assert_eq!(got(link.wait::<Go, ()>(within(10), &never)), go("42.0.r1"));
        write_json(&tmp.path().join(Bye::FILE), &bye("42.0.r1", 3)).unwrap();
        assert_eq!(got(link.wait::<Bye, ()>(within(10), &never)), bye("42.0.r1", 3));
    }

    #[test]
    fn a_task_0_gone_mid_wait_sends_the_task_back_to_the_files() {
        let tmp = tempfile::tempdir().unwrap();
        let board = Board::open(tmp.path(), "5.0.r0", "localhost", 2, None);
        board.post(&go("5.0.r0")).unwrap();
        std::fs::remove_file(tmp.path().join(Go::FILE)).unwrap();
        let mut link = Link::new(tmp.path(), "5.0.r0");
        got(link.wait::<Go, ()>(within(10), &never));
        assert!(link.connected());
        // Task 0's process ends: its connections close with it.
        drop(board);
        let staging = tmp.path().to_path_buf();
        let late = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            write_json(&staging.join(Bye::FILE), &bye("5.0.r0", 1)).unwrap();
        });
        let started = Instant::now();
        assert_eq!(got(link.wait::<Bye, ()>(within(10), &never)), bye("5.0.r0", 1));
        assert!(started.elapsed() < Duration::from_millis(600 + 300), "found before a slow look would");
        assert!(!link.connected());
        late.join().unwrap();
    }

    #[test]
    fn a_connection_that_carries_nothing_does_not_hide_the_files() {
        // A partition: the port accepts, nothing is ever said on it.
        let tmp = tempfile::tempdir().unwrap();
        let mute = fake_task_0(tmp.path(), "9.0.r0");
        let mut link = Link::new(tmp.path(), "9.0.r0");
        assert!(link.wait::<Go, ()>(Instant::now() + Duration::from_millis(300), &never).is_none());
        assert!(link.connected(), "connected to the mute port");
        write_json(&tmp.path().join(Go::FILE), &go("9.0.r0")).unwrap();
        let started = Instant::now();
        assert_eq!(got(link.wait::<Go, ()>(within(10), &never)), go("9.0.r0"));
        assert!(started.elapsed() < Duration::from_secs(3), "found by the slow look");
        drop(mute);
    }

    #[test]
    fn a_quit_ends_the_wait_and_a_port_saying_garbage_is_left() {
        let tmp = tempfile::tempdir().unwrap();
        let liar = fake_task_0(tmp.path(), "3.0.r0");
        let talker = std::thread::spawn(move || {
            let (mut peer, _) = liar.accept().unwrap();
            peer.write_all(b"{\"record\": 17}\n").unwrap();
            std::thread::sleep(Duration::from_millis(500));
        });
        let mut link = Link::new(tmp.path(), "3.0.r0");
        let quit_at = Instant::now() + Duration::from_millis(400);
        let quit = || (Instant::now() >= quit_at).then_some("stop");
        match link.wait::<Go, _>(within(10), &quit) {
            Some(Waited::Quit("stop")) => {}
            other => panic!("expected the quit, got {other:?}"),
        }
        assert!(link.heard.is_empty(), "the garbage was not taken");
        assert!(!link.connected(), "a port that says garbage is not task 0's, and not connected to again");
        talker.join().unwrap();
    }

    #[test]
    fn a_line_past_the_limit_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let flood = fake_task_0(tmp.path(), "4.0.r0");
        let talker = std::thread::spawn(move || {
            let (mut peer, _) = flood.accept().unwrap();
            // The task's hello read first: a socket closed with unread
            // bytes is reset, and the reset would throw the flood away.
            let mut hello = String::new();
            BufReader::new(peer.try_clone().unwrap()).read_line(&mut hello).unwrap();
            let chunk = vec![b'x'; 64 << 10];
            // No newline, ever: 2 MiB then the connection closes.
            for _ in 0..32 {
                if peer.write_all(&chunk).is_err() {
                    break;
                }
            }
        });
        let mut link = Link::new(tmp.path(), "4.0.r0");
        assert!(link.wait::<Go, ()>(Instant::now() + Duration::from_millis(1500), &never).is_none());
        assert!(!link.connected() && link.shunned.is_some(), "a port that floods is left");
        assert!(link.heard.is_empty());
        talker.join().unwrap();
    }

    #[test]
    fn records_relayed_through_task_0_are_appended_once_each_and_acked() {
        let tmp = tempfile::tempdir().unwrap();
        let events = tmp.path().join("events.jsonl");
        let board = Board::open(tmp.path(), "8.0.r0", "localhost", 5, Some(&events));
        board.post(&go("8.0.r0")).unwrap();
        std::fs::remove_file(tmp.path().join(Go::FILE)).unwrap();
        let staging = tmp.path().to_path_buf();
        let tasks: Vec<_> = (1..5)
            .map(|task| {
                let staging = staging.clone();
                std::thread::spawn(move || {
                    let mut link = Link::new(&staging, "8.0.r0");
                    got(link.wait::<Go, ()>(within(10), &never));
                    for n in 0..25 {
                        let line = serde_json::json!({"event": "child_start", "task": task, "n": n});
                        assert!(link.relay(&line), "task {task} record {n} acked");
                    }
                })
            })
            .collect();
        for t in tasks {
            t.join().unwrap();
        }
        let text = std::fs::read_to_string(&events).unwrap();
        let mut seen: Vec<(u64, u64)> = text
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                (v["task"].as_u64().unwrap(), v["n"].as_u64().unwrap())
            })
            .collect();
        seen.sort_unstable();
        let want: Vec<(u64, u64)> = (1..5).flat_map(|t| (0..25).map(move |n| (t, n))).collect();
        assert_eq!(seen, want, "every record once");
        // Not a record of events.jsonl: refused, and the task told to write
        // it itself at once (not after the ack's wait).
        let mut link = Link::new(tmp.path(), "8.0.r0");
        got(link.wait::<Go, ()>(within(10), &never));
        let started = Instant::now();
        assert!(!link.relay(&serde_json::json!({"no": "event"})));
        assert!(started.elapsed() < RELAY_ACK);
        assert_eq!(std::fs::read_to_string(&events).unwrap(), text, "nothing appended");
        // A connection that does not say the launch's token (from
        // `.exec-leader.json`, the user's alone) is served nothing, and
        // what it sends goes nowhere.
        let mode = std::fs::metadata(tmp.path().join(ADDRESS_FILE)).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let mut stranger = TcpStream::connect(("127.0.0.1", board.port().unwrap())).unwrap();
        stranger.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let forged = json_line(&Relayed { relay: 1, line: serde_json::json!({"event": "finish", "step": 9}) });
        stranger.write_all(&[json_line(&Hello { hello: "guess".into() }), forged].concat()).unwrap();
        let mut heard = Vec::new();
        let _ = std::io::Read::read_to_end(&mut stranger, &mut heard);
        assert!(heard.is_empty(), "a stranger heard {}", String::from_utf8_lossy(&heard));
        assert_eq!(std::fs::read_to_string(&events).unwrap(), text, "nothing appended");
    }

    #[test]
    fn a_board_that_takes_no_records_refuses_them_at_once_and_a_task_0_lost_is_left() {
        let tmp = tempfile::tempdir().unwrap();
        let board = Board::open(tmp.path(), "6.0.r0", "localhost", 2, None);
        board.post(&go("6.0.r0")).unwrap();
        std::fs::remove_file(tmp.path().join(Go::FILE)).unwrap();
        let mut link = Link::new(tmp.path(), "6.0.r0");
        got(link.wait::<Go, ()>(within(10), &never));
        let started = Instant::now();
        assert!(!link.relay(&serde_json::json!({"event": "child_start"})));
        assert!(started.elapsed() < RELAY_ACK, "refused, not timed out");
        assert!(link.connected());
        // Found lost: left for good, never connected to again.
        link.leave();
        assert!(!link.relay(&serde_json::json!({"event": "child_exit"})));
        assert!(link.wait::<Bye, ()>(Instant::now() + Duration::from_millis(300), &never).is_none());
        assert!(!link.connected());
    }

    #[test]
    fn an_event_log_whose_link_is_not_connected_appends_its_records_itself() {
        use crate::telemetry::{Event, EventContext, EventLog};
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("events.jsonl");
        let mut log = EventLog::open(&path, EventContext { node: "n2".into(), job_id: None, attempt: 0 }).unwrap();
        let link = SharedLink::new(Link::new(tmp.path(), "2.0.r0"));
        log.relay_through(Box::new(link.clone()));
        let started = Instant::now();
        log.record(&Event::Other(serde_json::json!({"event": "child_exit", "task": 1}))).unwrap();
        assert!(started.elapsed() < Duration::from_secs(1), "no wait for an ack without a connection");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("child_exit") && text.contains("\"node\":\"n2\""), "{text}");
        assert_eq!(link.lock().relayed, 0);
    }
}
