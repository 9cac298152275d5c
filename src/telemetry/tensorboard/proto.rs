//! The protobuf messages of a TensorBoard event file, declared with prost's
//! derive: only the fields rekindle writes and reads back, with the field
//! numbers of TensorFlow's `event.proto` and `summary.proto` (TensorBoard
//! ships the same messages as `tensorboard.Event`, `tensorboard.Summary`).
//! Fields a reader does not know are skipped when decoding, so events of
//! other writers in the same directory decode with `what: None`.

/// `tensorboard.Event`: one record of an event file.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Event {
    /// Seconds since the Unix epoch.
    #[prost(double, tag = "1")]
    pub wall_time: f64,
    #[prost(int64, tag = "2")]
    pub step: i64,
    #[prost(oneof = "What", tags = "3, 5, 7")]
    pub what: Option<What>,
}

/// What an [`Event`] holds (the members rekindle uses).
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum What {
    /// `brain.Event:2` in the first record of every file: readers then
    /// detect restarts by [`SessionLog`] `START`, not by steps going back.
    #[prost(string, tag = "3")]
    FileVersion(String),
    #[prost(message, tag = "5")]
    Summary(Summary),
    #[prost(message, tag = "7")]
    SessionLog(SessionLog),
}

/// `tensorboard.Summary`: the values of one step.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Summary {
    #[prost(message, repeated, tag = "1")]
    pub value: Vec<SummaryValue>,
}

/// `tensorboard.Summary.Value`, as a scalar (`simple_value`, a float32:
/// TensorBoard's scalar type).
#[derive(Clone, PartialEq, prost::Message)]
pub struct SummaryValue {
    #[prost(string, tag = "1")]
    pub tag: String,
    #[prost(float, optional, tag = "2")]
    pub simple_value: Option<f32>,
}

/// `tensorboard.SessionLog`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SessionLog {
    /// [`SESSION_START`], …
    #[prost(int32, tag = "1")]
    pub status: i32,
    #[prost(string, tag = "3")]
    pub msg: String,
}

/// `SessionLog.SessionStatus.START`: TensorBoard's reader discards every
/// value it holds at this event's step or later (a restart's orphans).
pub const SESSION_START: i32 = 1;

/// The `file_version` rekindle writes.
pub const FILE_VERSION: &str = "brain.Event:2";

impl Event {
    /// The tags and values of a summary event (none for other events).
    pub fn scalars(&self) -> impl Iterator<Item = (&str, f32)> {
        let values = match &self.what {
            Some(What::Summary(s)) => s.value.as_slice(),
            _ => &[],
        };
        values.iter().filter_map(|v| Some((v.tag.as_str(), v.simple_value?)))
    }
}
