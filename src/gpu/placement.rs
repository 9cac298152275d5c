//! The placement plan: how many data-parallel replicas, how many devices each
//! replica's layers are split over, the micro-batch and the accumulation that
//! keep the effective batch. A pure function of the usable devices' free
//! memory, the workload's footprint, the target effective batch and the
//! headroom; docs/placement.md explains the rules and the arithmetic.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::error::GpuError;
use crate::units::mib_or_gib;

/// Bytes the workload needs: model state (held once per replica, split over
/// the devices of a replica) and activations (per sample of a micro-batch).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Footprint {
    pub param_bytes: u64,
    pub grad_bytes: u64,
    pub optimizer_bytes: u64,
    pub activation_bytes_per_sample: u64,
}

impl Footprint {
    /// A footprint from a parameter count: parameters and gradients at
    /// `bytes_per_param` each, and AdamW's two moments kept in f32 (8 bytes
    /// per parameter) whatever the compute dtype.
    pub fn estimate_from_params(param_count: u64, bytes_per_param: u64, activation_bytes_per_sample: u64) -> Footprint {
        Footprint {
            param_bytes: param_count.saturating_mul(bytes_per_param),
            grad_bytes: param_count.saturating_mul(bytes_per_param),
            optimizer_bytes: param_count.saturating_mul(8),
            activation_bytes_per_sample,
        }
    }

    /// Parameters + gradients + optimizer state.
    pub fn state_bytes(&self) -> u64 {
        self.param_bytes.saturating_add(self.grad_bytes).saturating_add(self.optimizer_bytes)
    }

    /// About what one checkpoint holds: parameters and optimizer state.
    pub fn checkpoint_bytes(&self) -> u64 {
        self.param_bytes.saturating_add(self.optimizer_bytes)
    }
}

/// Where the replicas run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    Cpu,
    Cuda,
    Rocm,
}

impl fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Cuda => "cuda",
            DeviceKind::Rocm => "rocm",
        })
    }
}

/// The plan a run uses. `replicas × micro_batch × grad_accum` is the
/// effective batch. On the CPU there is one replica of one device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    pub device_kind: DeviceKind,
    pub replicas: usize,
    pub devices_per_replica: usize,
    pub micro_batch: usize,
    pub grad_accum: usize,
    pub reason: String,
}

impl Plan {
    /// Samples per optimizer step over all replicas.
    pub fn effective_batch(&self) -> usize {
        self.replicas * self.micro_batch * self.grad_accum
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} replica(s) × {} device(s), micro-batch {} × {} accumulation step(s) = effective batch {}",
            self.device_kind,
            self.replicas,
            self.devices_per_replica,
            self.micro_batch,
            self.grad_accum,
            self.effective_batch()
        )
    }
}

/// One usable device as placement sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanDevice {
    /// The device's index (for the assignment and messages).
    pub index: u32,
    pub free_bytes: u64,
}

/// Everything [`place`] decides from.
#[derive(Debug, Clone, PartialEq)]
pub struct PlacementRequest {
    /// The kind of `devices` (ignored when there are none).
    pub kind: DeviceKind,
    pub devices: Vec<PlanDevice>,
    pub footprint: Footprint,
    /// Samples per optimizer step the run wants.
    pub target_batch: usize,
    /// Fraction of free memory left unused, `0 <= headroom < 1`.
    pub headroom: f64,
    /// Available host memory for the CPU plan; `None`: not checked.
    pub host_free_bytes: Option<u64>,
}

/// A plan and which devices each replica uses (stage order within a replica).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Placement {
    pub plan: Plan,
    /// Device indices per replica; empty on the CPU.
    pub groups: Vec<Vec<u32>>,
}

/// One arrangement that fits: `groups.len()` replicas of `k` devices each.
struct Candidate {
    k: usize,
    groups: Vec<Vec<PlanDevice>>,
    /// Samples per micro-batch the tightest group holds.
    capacity: u64,
}

/// Chooses the plan (see docs/placement.md):
/// - no device: the CPU;
/// - otherwise the arrangement with the most replicas that fits and divides
///   the target batch, then the fewest devices per replica (data parallel
///   before layer split), then the most room per micro-batch;
/// - the micro-batch is the largest divisor of the per-replica batch that
///   fits, and accumulation makes up the rest, so the effective batch is
///   exactly the target.
pub fn place(request: &PlacementRequest) -> Result<Placement, GpuError> {
    let invalid = |reason: String| Err(GpuError::NoPlacement { reason });
    let batch = request.target_batch;
    if batch == 0 {
        return invalid("the target effective batch must be at least 1".into());
    }
    let headroom = request.headroom;
    if !(0.0..1.0).contains(&headroom) {
        return invalid(format!("headroom must be at least 0 and below 1 (got {headroom})"));
    }
    let footprint = &request.footprint;
    let state = footprint.state_bytes();
    let per_sample = footprint.activation_bytes_per_sample;

    if request.devices.is_empty() {
        return place_on_cpu(request, state, per_sample);
    }

    let usable = |d: &PlanDevice| (d.free_bytes as f64 * (1.0 - headroom)).floor() as u64;
    let mut sorted = request.devices.clone();
    // Largest first; equal sizes in index order, so plans are deterministic.
    sorted.sort_by(|a, b| usable(b).cmp(&usable(a)).then(a.index.cmp(&b.index)));
    let n = sorted.len();
    let (best, fits_but_indivisible) = best_candidate(&sorted, batch, state, per_sample, &usable);

    let largest = usable(&sorted[0]);
    let total: u64 = sorted.iter().map(usable).sum();
    let Some(best) = best else {
        let kind = request.kind;
        return invalid(format!(
            "the model does not fit the {n} {kind} device(s): it needs {} of state plus {} per sample, but they \
             offer {} together ({} on the largest) after {:.0}% headroom; use more or larger GPUs, lower \
             [gpu] headroom, or a smaller model",
            mib_or_gib(state),
            mib_or_gib(per_sample),
            mib_or_gib(total),
            mib_or_gib(largest),
            headroom * 100.0
        ));
    };

    let replicas = best.groups.len();
    let per_replica = batch / replicas;
    let micro_batch = largest_divisor_at_most(per_replica, best.capacity);
    let grad_accum = per_replica / micro_batch;
    let used = replicas * best.k;

    let mut reason = match (replicas, best.k) {
        (1, 1) => {
            format!(
                "single device: the model state ({}) fits on {}",
                mib_or_gib(state),
                name(request.kind, &best.groups[0])
            )
        }
        (_, 1) => format!(
            "data parallel over {replicas} devices: the model state ({}) fits on each (smallest used: {} usable)",
            mib_or_gib(state),
            mib_or_gib(best.groups.iter().map(|g| usable(&g[0])).min().unwrap_or(0))
        ),
        (1, k) => format!(
            "layer split (pipeline) over {k} devices: the model state ({}) does not fit one device \
             ({} usable on the largest)",
            mib_or_gib(state),
            mib_or_gib(largest)
        ),
        (_, k) => format!(
            "hybrid: {replicas} data-parallel replicas, each with its layers split over {k} devices, because \
             the model state ({}) does not fit one device ({} usable on the largest)",
            mib_or_gib(state),
            mib_or_gib(largest)
        ),
    };
    let room = if best.capacity == u64::MAX { "any number of".to_string() } else { best.capacity.to_string() };
    reason.push_str(&format!(
        "; after {:.0}% headroom there is room for {room} samples per micro-batch ({} each); \
         micro-batch {micro_batch} × {grad_accum} accumulation step(s) × {replicas} replica(s) = effective batch {batch}",
        headroom * 100.0,
        mib_or_gib(per_sample),
    ));
    if micro_batch < per_replica && (micro_batch as u64) < best.capacity {
        reason.push_str(&format!(
            " (the micro-batch is the largest divisor of {per_replica} samples per replica that fits)"
        ));
    }
    if used < n {
        let idle: Vec<String> = sorted[used..].iter().map(|d| d.index.to_string()).collect();
        let why = if fits_but_indivisible {
            format!("more replicas would fit but the effective batch {batch} does not split evenly over them")
        } else {
            "they cannot hold a further replica".to_string()
        };
        reason.push_str(&format!("; {} idle device(s) ({}): {why}", n - used, idle.join(", ")));
    }

    let plan =
        Plan { device_kind: request.kind, replicas, devices_per_replica: best.k, micro_batch, grad_accum, reason };
    let groups = best.groups.iter().map(|g| g.iter().map(|d| d.index).collect()).collect();
    Ok(Placement { plan, groups })
}

/// The best arrangement of `sorted` devices (largest first): the most
/// replicas that fit and divide `batch`, then the fewest devices per
/// replica, then the most room per micro-batch; and whether more replicas
/// would have fit but for the batch not splitting evenly over them.
fn best_candidate(
    sorted: &[PlanDevice],
    batch: usize,
    state: u64,
    per_sample: u64,
    usable: &dyn Fn(&PlanDevice) -> u64,
) -> (Option<Candidate>, bool) {
    let n = sorted.len();
    let mut best: Option<Candidate> = None;
    let mut fits_but_indivisible = false;
    for k in 1..=n {
        for replicas in 1..=n / k {
            let groups = balance(&sorted[..replicas * k], replicas, usable);
            let capacity = groups.iter().map(|g| capacity(g.iter().map(usable).sum(), state, per_sample)).min();
            let Some(capacity) = capacity.filter(|&c| c >= 1) else { continue };
            if !batch.is_multiple_of(replicas) {
                fits_but_indivisible = true;
                continue;
            }
            let better = match &best {
                None => true,
                Some(b) => {
                    (replicas, std::cmp::Reverse(k), capacity) > (b.groups.len(), std::cmp::Reverse(b.k), b.capacity)
                }
            };
            if better {
                best = Some(Candidate { k, groups, capacity });
            }
        }
    }
    (best, fits_but_indivisible)
}

fn place_on_cpu(request: &PlacementRequest, state: u64, per_sample: u64) -> Result<Placement, GpuError> {
    let batch = request.target_batch;
    let (capacity, memory) = match request.host_free_bytes {
        Some(free) => {
            let usable = (free as f64 * (1.0 - request.headroom)).floor() as u64;
            let capacity = capacity(usable, state, per_sample);
            if capacity == 0 {
                return Err(GpuError::NoPlacement {
                    reason: format!(
                        "no GPU is visible and the model does not fit host memory: it needs {} of state plus {} \
                         per sample, {} usable after {:.0}% headroom",
                        mib_or_gib(state),
                        mib_or_gib(per_sample),
                        mib_or_gib(usable),
                        request.headroom * 100.0
                    ),
                });
            }
            (
                capacity,
                format!("; host memory: {} usable holds the model state ({})", mib_or_gib(usable), mib_or_gib(state)),
            )
        }
        None => (u64::MAX, String::new()),
    };
    let micro_batch = largest_divisor_at_most(batch, capacity);
    let grad_accum = batch / micro_batch;
    let reason = format!(
        "no usable GPU: training on the CPU with micro-batch {micro_batch} × {grad_accum} accumulation step(s) = \
         effective batch {batch}{memory}"
    );
    let plan =
        Plan { device_kind: DeviceKind::Cpu, replicas: 1, devices_per_replica: 1, micro_batch, grad_accum, reason };
    Ok(Placement { plan, groups: Vec::new() })
}

/// Samples per micro-batch that fit in `usable` bytes next to `state`
/// (0: not even the state fits; `u64::MAX`: activations are free).
fn capacity(usable: u64, state: u64, per_sample: u64) -> u64 {
    match usable.checked_sub(state) {
        None => 0,
        Some(_) if per_sample == 0 => u64::MAX,
        Some(left) => left / per_sample,
    }
}

/// Splits `devices` (largest first) into `groups` groups of equal count,
/// each device to the group with the least usable memory so far that still
/// has room: the smallest group total is as large as it can be for up to
/// four devices, and close to it beyond.
fn balance(devices: &[PlanDevice], groups: usize, usable: &dyn Fn(&PlanDevice) -> u64) -> Vec<Vec<PlanDevice>> {
    let per_group = devices.len() / groups;
    let mut out: Vec<Vec<PlanDevice>> = vec![Vec::with_capacity(per_group); groups];
    let mut totals = vec![0u64; groups];
    for device in devices {
        let target = (0..groups)
            .filter(|&g| out[g].len() < per_group)
            .min_by_key(|&g| (totals[g], g))
            .expect("devices.len() is groups × per_group");
        totals[target] += usable(device);
        out[target].push(*device);
    }
    out
}

/// The largest divisor of `n` that is at most `cap` (at least 1).
fn largest_divisor_at_most(n: usize, cap: u64) -> usize {
    let cap = usize::try_from(cap).unwrap_or(usize::MAX).min(n).max(1);
    (1..=cap).rev().find(|&d| n.is_multiple_of(d)).unwrap_or(1)
}

fn name(kind: DeviceKind, group: &[PlanDevice]) -> String {
    group.iter().map(|d| format!("{kind} {}", d.index)).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 1 << 30;
    const M: u64 = 1 << 20;

    fn devices(gib: &[u64]) -> Vec<PlanDevice> {
        gib.iter().enumerate().map(|(i, &g)| PlanDevice { index: i as u32, free_bytes: g * G }).collect()
    }

    /// State of `state_gib` (split evenly into params, grads and optimizer
    /// state) and `act_mib` per sample.
    fn footprint(state_gib: u64, act_mib: u64) -> Footprint {
        let third = state_gib * G / 3;
        Footprint {
            param_bytes: third,
            grad_bytes: third,
            optimizer_bytes: state_gib * G - 2 * third,
            activation_bytes_per_sample: act_mib * M,
        }
    }

    fn request(gib: &[u64], state_gib: u64, act_mib: u64, batch: usize) -> PlacementRequest {
        PlacementRequest {
            kind: DeviceKind::Cuda,
            devices: devices(gib),
            footprint: footprint(state_gib, act_mib),
            target_batch: batch,
            headroom: 0.25,
            host_free_bytes: None,
        }
    }

    fn plan(gib: &[u64], state_gib: u64, act_mib: u64, batch: usize) -> Placement {
        place(&request(gib, state_gib, act_mib, batch)).unwrap_or_else(|e| panic!("{gib:?}: {e}"))
    }

    /// (replicas, devices per replica, micro-batch, accumulation).
    fn shape(p: &Placement) -> (usize, usize, usize, usize) {
        (p.plan.replicas, p.plan.devices_per_replica, p.plan.micro_batch, p.plan.grad_accum)
    }

    fn assert_keeps_effective_batch(p: &Placement, batch: usize) {
        assert_eq!(p.plan.effective_batch(), batch, "{}", p.plan.reason);
        assert_eq!(p.groups.len(), if p.plan.device_kind == DeviceKind::Cpu { 0 } else { p.plan.replicas });
        for g in &p.groups {
            assert_eq!(g.len(), p.plan.devices_per_replica);
        }
    }

    #[test]
    fn no_device_means_cpu() {
        let p = plan(&[], 1, 10, 32);
        assert_eq!(p.plan.device_kind, DeviceKind::Cpu);
        assert_eq!(shape(&p), (1, 1, 32, 1));
        assert!(p.plan.reason.starts_with("no usable GPU: training on the CPU"), "{}", p.plan.reason);
        assert!(p.groups.is_empty());
    }

    #[test]
    fn cpu_micro_batch_follows_host_memory() {
        let mut r = request(&[], 2, 512, 64);
        r.host_free_bytes = Some(8 * G); // 6 GiB usable: 4 GiB for activations = 8 samples
        let p = place(&r).unwrap();
        assert_eq!(shape(&p), (1, 1, 8, 8));
        r.host_free_bytes = Some(2 * G);
        let err = place(&r).unwrap_err().to_string();
        assert!(err.contains("does not fit host memory"), "{err}");
    }

    #[test]
    fn one_device_accumulates_what_does_not_fit() {
        // 16 GiB: 12 usable, 4 GiB state, 8 GiB for 1 GiB samples = 8 per micro-batch.
        let p = plan(&[16], 4, 1024, 64);
        assert_eq!(shape(&p), (1, 1, 8, 8));
        assert!(
            p.plan.reason.starts_with("single device: the model state (4.0 GiB) fits on cuda 0"),
            "{}",
            p.plan.reason
        );
        assert_eq!(p.groups, [[0]]);
        // Plenty of room: no accumulation.
        assert_eq!(shape(&plan(&[80], 4, 1024, 32)), (1, 1, 32, 1));
    }

    #[test]
    fn micro_batch_divides_the_per_replica_batch() {
        // Room for 7 samples; 30 = 6 × 5.
        let p = plan(&[16], 5, 1024, 30);
        assert_eq!(shape(&p), (1, 1, 6, 5));
        assert!(p.plan.reason.contains("largest divisor"), "{}", p.plan.reason);
    }

    #[test]
    fn two_to_four_devices_run_data_parallel_when_the_model_fits_one() {
        for (gib, n) in [(&[24u64, 24][..], 2), (&[40, 40, 40], 3), (&[80, 80, 80, 80], 4), (&[16, 16, 16, 16], 4)] {
            let p = plan(gib, 4, 256, 48);
            assert_eq!((p.plan.replicas, p.plan.devices_per_replica), (n, 1), "{gib:?}");
            assert_keeps_effective_batch(&p, 48);
            assert!(p.plan.reason.starts_with(&format!("data parallel over {n} devices")), "{}", p.plan.reason);
        }
    }

    #[test]
    fn layer_split_when_the_model_fits_no_single_device() {
        // 20 GiB of state; 16 GiB devices hold 12 each, two hold 24.
        let p = plan(&[16, 16], 20, 256, 32);
        assert_eq!((p.plan.replicas, p.plan.devices_per_replica), (1, 2));
        assert!(p.plan.reason.starts_with("layer split (pipeline) over 2 devices"), "{}", p.plan.reason);
        assert_keeps_effective_batch(&p, 32);
        // 4 GiB left over two devices = 16 samples of 256 MiB.
        assert_eq!(p.plan.micro_batch, 16);
    }

    #[test]
    fn three_devices_split_over_all_three_when_two_are_not_enough() {
        let p = plan(&[16, 16, 16], 30, 256, 32);
        assert_eq!((p.plan.replicas, p.plan.devices_per_replica), (1, 3));
        assert_keeps_effective_batch(&p, 32);
    }

    #[test]
    fn three_devices_leave_one_idle_when_two_suffice_for_the_only_replica() {
        let p = plan(&[16, 16, 16], 20, 256, 32);
        assert_eq!((p.plan.replicas, p.plan.devices_per_replica), (1, 2));
        assert!(
            p.plan.reason.contains("1 idle device(s) (2): they cannot hold a further replica"),
            "{}",
            p.plan.reason
        );
    }

    #[test]
    fn four_devices_make_a_hybrid_of_two_split_replicas() {
        for gib in [[24u64, 24, 24, 24], [16, 16, 16, 16]] {
            let state = if gib[0] == 24 { 30 } else { 20 };
            let p = plan(&gib, state, 256, 64);
            assert_eq!((p.plan.replicas, p.plan.devices_per_replica), (2, 2), "{gib:?}");
            assert!(p.plan.reason.starts_with("hybrid: 2 data-parallel replicas"), "{}", p.plan.reason);
            assert_keeps_effective_batch(&p, 64);
        }
    }

    #[test]
    fn four_devices_split_four_ways_when_needed() {
        let p = plan(&[16, 16, 16, 16], 40, 256, 64);
        assert_eq!((p.plan.replicas, p.plan.devices_per_replica), (1, 4));
    }

    #[test]
    fn mixed_sizes_pair_large_with_small() {
        // 30 GiB state: the 80s alone hold it, the 24s do not. With a 24 as a
        // partner each 80 still holds a replica; two replicas data parallel.
        let p = plan(&[80, 24, 80, 24], 30, 256, 32);
        assert_eq!((p.plan.replicas, p.plan.devices_per_replica), (2, 1));
        assert_eq!(p.groups, [[0], [2]]);
        // 65 GiB: an 80 holds 60 usable, an 80 + 24 pair 78: two hybrid replicas, big with small.
        let p = plan(&[80, 24, 80, 24], 65, 256, 32);
        assert_eq!((p.plan.replicas, p.plan.devices_per_replica), (2, 2));
        let mut groups = p.groups.clone();
        groups.iter_mut().for_each(|g| g.sort());
        assert_eq!(groups, [[0, 1], [2, 3]]);
    }

    #[test]
    fn mixed_sizes_data_parallel_is_limited_by_the_smallest_device() {
        // 40 + 24 GiB, 4 GiB state: room on the 24 (18 usable - 4) = 14 GiB = 56 samples of 256 MiB.
        let p = plan(&[40, 24], 4, 256, 128);
        assert_eq!(shape(&p), (2, 1, 32, 2));
        // A model only the 40 holds runs there alone.
        let p = plan(&[40, 24], 20, 256, 32);
        assert_eq!((p.plan.replicas, p.plan.devices_per_replica), (1, 1));
        assert_eq!(p.groups, [[0]]);
        assert!(p.plan.reason.contains("idle device(s) (1)"), "{}", p.plan.reason);
    }

    #[test]
    fn replicas_divide_the_effective_batch() {
        // Three devices but a batch of 32: two replicas, the third idle.
        let p = plan(&[40, 40, 40], 4, 256, 32);
        assert_eq!((p.plan.replicas, p.plan.devices_per_replica), (2, 1));
        assert!(p.plan.reason.contains("does not split evenly"), "{}", p.plan.reason);
        assert_keeps_effective_batch(&p, 32);
        // A batch of 1 uses one device.
        assert_eq!(plan(&[40, 40, 40, 40], 4, 256, 1).plan.replicas, 1);
    }

    #[test]
    fn not_fitting_anywhere_is_a_clear_error() {
        let err = place(&request(&[16, 16, 16, 16], 60, 256, 32)).unwrap_err().to_string();
        assert!(err.contains("does not fit the 4 cuda device(s)"), "{err}");
        assert!(err.contains("60.0 GiB of state"), "{err}");
        assert!(err.contains("48.0 GiB together (12.0 GiB on the largest) after 25% headroom"), "{err}");
        // State fits exactly but no room for one sample.
        assert!(place(&request(&[16], 12, 256, 8)).is_err());
    }

    #[test]
    fn headroom_changes_what_fits() {
        let mut r = request(&[16], 13, 256, 8);
        assert!(place(&r).is_err());
        r.headroom = 0.1;
        assert_eq!(shape(&place(&r).unwrap()).0, 1);
        r.headroom = 1.0;
        assert!(place(&r).unwrap_err().to_string().contains("headroom must be"));
    }

    #[test]
    fn zero_batch_is_refused() {
        assert!(place(&request(&[16], 1, 1, 0)).unwrap_err().to_string().contains("at least 1"));
    }

    #[test]
    fn free_activations_take_the_whole_batch() {
        assert_eq!(shape(&plan(&[16, 16], 1, 0, 64)), (2, 1, 32, 1));
    }

    #[test]
    fn every_plan_for_zero_to_four_devices_keeps_the_effective_batch() {
        let sizes = [16u64, 24, 40, 80];
        let mut checked = 0;
        for n in 0..=4usize {
            // Every multiset of n sizes (non-decreasing sequences).
            let mut combos: Vec<Vec<u64>> = vec![vec![]];
            for _ in 0..n {
                let mut next = Vec::new();
                for c in &combos {
                    for &s in sizes.iter().filter(|&&s| c.last().is_none_or(|&l| s >= l)) {
                        let mut longer = c.clone();
                        longer.push(s);
                        next.push(longer);
                    }
                }
                combos = next;
            }
            for gib in &combos {
                for state in [1u64, 10, 25, 50, 100, 250] {
                    for batch in [1usize, 12, 32, 96] {
                        match place(&request(gib, state, 512, batch)) {
                            Ok(p) => {
                                assert_keeps_effective_batch(&p, batch);
                                let used: usize = p.groups.iter().map(Vec::len).sum();
                                assert!(used <= n);
                                if n == 0 {
                                    assert_eq!(p.plan.device_kind, DeviceKind::Cpu);
                                }
                            }
                            Err(e) => {
                                let total: u64 = gib.iter().sum();
                                assert!((total as f64 * 0.75) < state as f64 + 0.5, "{gib:?} {state}: {e}");
                            }
                        }
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked > 1000);
    }

    #[test]
    fn plans_are_deterministic_and_prefer_lower_indices_among_equals() {
        let a = plan(&[24, 24, 24], 20, 256, 32);
        let b = plan(&[24, 24, 24], 20, 256, 32);
        assert_eq!(a, b);
        assert_eq!(a.groups, [[0, 1]]);
    }

    #[test]
    fn footprint_estimate_counts_adamw_moments_in_f32() {
        let f = Footprint::estimate_from_params(1_000, 2, 64);
        assert_eq!((f.param_bytes, f.grad_bytes, f.optimizer_bytes), (2_000, 2_000, 8_000));
        assert_eq!(f.state_bytes(), 12_000);
        assert_eq!(f.checkpoint_bytes(), 10_000);
    }

    #[test]
    fn plan_serialises_with_the_documented_field_names() {
        let p = plan(&[16], 1, 1, 4).plan;
        let json = serde_json::to_value(&p).unwrap();
        let mut keys: Vec<&str> = json.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort();
        assert_eq!(keys, ["device_kind", "devices_per_replica", "grad_accum", "micro_batch", "reason", "replicas"]);
        assert_eq!(json["device_kind"], "cuda");
    }
}
