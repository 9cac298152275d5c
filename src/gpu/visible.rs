//! Which of the probed devices are allotted to this job: a pure function of
//! the environment and the probed devices.
//!
//! NVIDIA: `CUDA_VISIBLE_DEVICES`, read as CUDA reads it — a comma-separated
//! list of indices, `GPU-…` UUIDs (a unique prefix is enough) or `MIG-…`
//! UUIDs; the first entry that is invalid, matches no device, matches more
//! than one, or repeats an earlier one ends the list (so `-1`,
//! `NoDevFiles` and the empty string mean no device); the devices are in list
//! order. Unset means every device.
//!
//! AMD: `ROCR_VISIBLE_DEVICES` (indices or `GPU-<unique id>`) picks from the
//! devices, then `HIP_VISIBLE_DEVICES` picks by position from what ROCr left,
//! both with the same list rules.
//!
//! When a vendor's own variable is unset, `SLURM_STEP_GPUS` (else
//! `SLURM_JOB_GPUS`) — the node-local indices SLURM allotted — narrows that
//! vendor's devices. If those indices do not all exist but there are exactly
//! as many devices as entries, the job's cgroup has already hidden the rest
//! (and renumbered what is left), so every probed device is the job's.

use std::collections::BTreeMap;

use serde::Serialize;

use super::probe::{GpuDevice, Vendor};

/// Environment variables by name (only the ones read here matter).
pub type EnvMap = BTreeMap<String, String>;

/// The process environment as an [`EnvMap`]: the variables whose name and
/// value are UTF-8 (`std::env::vars` panics on any other, and a site's
/// environment may hold one; none of the variables rekindle reads can be
/// one and still mean something).
pub fn utf8_env() -> EnvMap {
    std::env::vars_os().filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))).collect()
}

/// The variables [`visible_devices`] reads.
pub const VISIBILITY_VARIABLES: [&str; 5] =
    ["CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS"];

/// The devices of this job, in the order the runtime will number them, and
/// how that was decided.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Visible {
    pub devices: Vec<GpuDevice>,
    /// Which variable decided, and every entry that was ignored.
    pub notes: Vec<String>,
}

/// The visibility variables of this process's environment.
pub fn process_env() -> EnvMap {
    VISIBILITY_VARIABLES.iter().filter_map(|name| std::env::var(name).ok().map(|v| (name.to_string(), v))).collect()
}

/// The devices among `probed` that this job may use (see the module docs).
pub fn visible_devices(env: &EnvMap, probed: &[GpuDevice]) -> Visible {
    let mut visible = Visible::default();
    let of = |vendor| probed.iter().filter(|d| d.vendor == vendor).cloned().collect::<Vec<_>>();

    let nvidia = of(Vendor::Nvidia);
    if !nvidia.is_empty() || env.contains_key("CUDA_VISIBLE_DEVICES") {
        let chosen = match env.get("CUDA_VISIBLE_DEVICES") {
            Some(list) => select("CUDA_VISIBLE_DEVICES", list, &nvidia, Addressing::ByIndex, &mut visible.notes),
            None => slurm(env, nvidia, &mut visible.notes),
        };
        visible.devices.extend(chosen);
    }

    let amd = of(Vendor::Amd);
    let rocr = env.get("ROCR_VISIBLE_DEVICES");
    let hip = env.get("HIP_VISIBLE_DEVICES");
    if !amd.is_empty() || rocr.is_some() || hip.is_some() {
        let mut chosen = match rocr {
            Some(list) => select("ROCR_VISIBLE_DEVICES", list, &amd, Addressing::ByIndex, &mut visible.notes),
            None if hip.is_none() => slurm(env, amd, &mut visible.notes),
            None => amd,
        };
        if let Some(list) = hip {
            chosen = select("HIP_VISIBLE_DEVICES", list, &chosen, Addressing::ByPosition, &mut visible.notes);
        }
        visible.devices.extend(chosen);
    }
    visible
}

/// Whether index entries name a device's own index (CUDA, ROCr) or its
/// position in an already-filtered list (HIP after ROCr).
#[derive(Clone, Copy)]
enum Addressing {
    ByIndex,
    ByPosition,
}

/// Applies one list variable with CUDA's rules.
fn select(
    var: &str,
    list: &str,
    devices: &[GpuDevice],
    addressing: Addressing,
    notes: &mut Vec<String>,
) -> Vec<GpuDevice> {
    let mut chosen: Vec<usize> = Vec::new();
    if list.trim().is_empty() {
        notes.push(format!("{var} is empty: no device is visible"));
        return Vec::new();
    }
    let entries: Vec<&str> = list.split(',').map(str::trim).collect();
    for (n, entry) in entries.iter().enumerate() {
        let found = match find(entry, devices, addressing) {
            Ok(i) if chosen.contains(&i) => Err("repeats an earlier entry".to_string()),
            other => other,
        };
        match found {
            Ok(i) => chosen.push(i),
            Err(why) => {
                let ignored = if n + 1 < entries.len() { " and the entries after it are" } else { " is" };
                notes.push(format!("{var}: entry {entry:?} {why}; it{ignored} ignored (as the runtime does)"));
                break;
            }
        }
    }
    let picked: Vec<GpuDevice> = chosen.iter().map(|&i| devices[i].clone()).collect();
    notes.push(format!("{var}={list:?} selects {} of {} device(s)", picked.len(), devices.len()));
    picked
}

/// Position in `devices` of the one device `entry` names.
fn find(entry: &str, devices: &[GpuDevice], addressing: Addressing) -> Result<usize, String> {
    if let Ok(n) = entry.parse::<u32>() {
        return match addressing {
            Addressing::ByPosition if (n as usize) < devices.len() => Ok(n as usize),
            Addressing::ByPosition => Err(format!("matches no device (only {} visible before it)", devices.len())),
            // MIG instances are addressed by UUID only: CUDA cannot pick one by index.
            Addressing::ByIndex => devices
                .iter()
                .position(|d| d.index == n && !d.is_mig())
                .ok_or_else(|| format!("matches no device (no GPU with index {n})")),
        };
    }
    let prefix = entry.to_ascii_lowercase();
    let is_uuid = prefix.starts_with("gpu-") || prefix.starts_with("mig-");
    if !is_uuid || prefix.len() <= 4 {
        return Err("is neither an index nor a GPU-/MIG- UUID".to_string());
    }
    let matches: Vec<usize> = devices
        .iter()
        .enumerate()
        .filter(|(_, d)| d.uuid.as_deref().is_some_and(|u| u.to_ascii_lowercase().starts_with(&prefix)))
        .map(|(i, _)| i)
        .collect();
    match matches[..] {
        [one] => Ok(one),
        [] => Err("matches no device UUID".to_string()),
        _ => Err(format!("is a prefix of {} device UUIDs (ambiguous)", matches.len())),
    }
}

/// Narrows one vendor's devices to SLURM's allotment, when SLURM says.
fn slurm(env: &EnvMap, devices: Vec<GpuDevice>, notes: &mut Vec<String>) -> Vec<GpuDevice> {
    let Some((var, list)) = ["SLURM_STEP_GPUS", "SLURM_JOB_GPUS"].iter().find_map(|v| env.get(*v).map(|l| (*v, l)))
    else {
        return devices;
    };
    if devices.is_empty() {
        return devices;
    }
    let Some(indices) = parse_slurm_list(list) else {
        notes.push(format!("{var}={list:?} is not a list of GPU indices; ignored"));
        return devices;
    };
    let matched: Vec<GpuDevice> =
        devices.iter().filter(|d| !d.is_mig() && indices.contains(&d.index)).cloned().collect();
    if matched.len() == indices.len() {
        notes.push(format!("{var}={list:?} selects {} of {} device(s)", matched.len(), devices.len()));
        return matched;
    }
    if devices.len() == indices.len() {
        notes.push(format!(
            "{var}={list:?}: the job's cgroup shows exactly the {} allotted device(s), renumbered; using all of them",
            devices.len()
        ));
        return devices;
    }
    notes.push(format!(
        "{var}={list:?}: only {} of its {} indices match a probed device; using those",
        matched.len(),
        indices.len()
    ));
    matched
}

/// `0,1`, `0-3`, `0,2-3` → indices; `None` when any part is not one.
fn parse_slurm_list(list: &str) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (a.trim().parse::<u32>().ok()?, b.trim().parse::<u32>().ok()?);
                if a > b || b - a > 1024 {
                    return None;
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().ok()?),
        }
    }
    out.dedup();
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::probe::tests::device;

    fn env(pairs: &[(&str, &str)]) -> EnvMap {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    /// Four NVIDIA GPUs with UUIDs GPU-aaaa0000…, GPU-bbbb1111…, GPU-bbbb2222…, GPU-cccc3333….
    fn four_nvidia() -> Vec<GpuDevice> {
        ["GPU-aaaa0000-0000", "GPU-bbbb1111-0000", "GPU-bbbb2222-0000", "GPU-cccc3333-0000"]
            .iter()
            .enumerate()
            .map(|(i, uuid)| device(Vendor::Nvidia, i as u32, Some(uuid), 80, 80))
            .collect()
    }

    fn indices(env_pairs: &[(&str, &str)], devices: &[GpuDevice]) -> Vec<u32> {
        visible_devices(&env(env_pairs), devices).devices.iter().map(|d| d.index).collect()
    }

    #[test]
    fn unset_variables_mean_every_device() {
        assert_eq!(indices(&[], &four_nvidia()), [0, 1, 2, 3]);
        let v = visible_devices(&EnvMap::new(), &four_nvidia());
        assert!(v.notes.is_empty(), "{:?}", v.notes);
    }

    #[test]
    fn empty_cuda_visible_devices_means_no_device() {
        assert_eq!(indices(&[("CUDA_VISIBLE_DEVICES", "")], &four_nvidia()), Vec::<u32>::new());
        assert_eq!(indices(&[("CUDA_VISIBLE_DEVICES", "  ")], &four_nvidia()), Vec::<u32>::new());
    }

    #[test]
    fn indices_select_in_list_order() {
        assert_eq!(indices(&[("CUDA_VISIBLE_DEVICES", "2,0")], &four_nvidia()), [2, 0]);
        assert_eq!(indices(&[("CUDA_VISIBLE_DEVICES", " 3 , 1 ")], &four_nvidia()), [3, 1]);
    }

    #[test]
    fn an_invalid_entry_ends_the_list_like_cuda() {
        for (list, expected) in [
            ("0,7,1", vec![0]),
            ("1,x,2", vec![1]),
            ("-1", vec![]),
            ("NoDevFiles", vec![]),
            ("0,1,", vec![0, 1]),
            ("0,,1", vec![0]),
            ("0,0,1", vec![0]),
            ("GPU-", vec![]),
        ] {
            assert_eq!(indices(&[("CUDA_VISIBLE_DEVICES", list)], &four_nvidia()), expected, "{list:?}");
        }
    }

    #[test]
    fn ignored_entries_are_explained() {
        let v = visible_devices(&env(&[("CUDA_VISIBLE_DEVICES", "0,7,1")]), &four_nvidia());
        assert!(v.notes[0].contains("entry \"7\" matches no device"), "{:?}", v.notes);
        assert!(v.notes[0].contains("the entries after it are ignored"), "{:?}", v.notes);
        assert_eq!(v.notes[1], "CUDA_VISIBLE_DEVICES=\"0,7,1\" selects 1 of 4 device(s)");
    }

    #[test]
    fn uuids_and_unique_prefixes_select_devices() {
        let d = four_nvidia();
        assert_eq!(indices(&[("CUDA_VISIBLE_DEVICES", "GPU-cccc3333-0000,GPU-aaaa")], &d), [3, 0]);
        assert_eq!(indices(&[("CUDA_VISIBLE_DEVICES", "gpu-BBBB2")], &d), [2]);
        // Ambiguous prefix: stops the list.
        assert_eq!(indices(&[("CUDA_VISIBLE_DEVICES", "GPU-aaaa,GPU-bbbb,3")], &d), [0]);
        assert_eq!(indices(&[("CUDA_VISIBLE_DEVICES", "GPU-ffff")], &d), Vec::<u32>::new());
        // Index and UUID naming the same device is a repeat.
        assert_eq!(indices(&[("CUDA_VISIBLE_DEVICES", "0,GPU-aaaa,1")], &d), [0]);
    }

    #[test]
    fn mig_instances_are_selected_by_uuid_only() {
        let mut d = vec![device(Vendor::Nvidia, 0, Some("GPU-aaaa0000"), 80, 80)];
        d.push(device(Vendor::Nvidia, 1, Some("MIG-11112222-3333"), 10, 10));
        d.push(device(Vendor::Nvidia, 1, Some("MIG-44445555-6666"), 10, 10));
        let uuids = |pairs: &[(&str, &str)]| -> Vec<String> {
            visible_devices(&env(pairs), &d).devices.into_iter().map(|d| d.uuid.unwrap()).collect()
        };
        assert_eq!(uuids(&[("CUDA_VISIBLE_DEVICES", "MIG-44445555-6666")]), ["MIG-44445555-6666"]);
        assert_eq!(uuids(&[("CUDA_VISIBLE_DEVICES", "MIG-1111,0")]), ["MIG-11112222-3333", "GPU-aaaa0000"]);
        assert_eq!(uuids(&[("CUDA_VISIBLE_DEVICES", "1")]), Vec::<String>::new());
        assert_eq!(uuids(&[]).len(), 3);
    }

    #[test]
    fn cuda_variable_does_not_touch_amd_devices() {
        let d = vec![device(Vendor::Nvidia, 0, None, 80, 80), device(Vendor::Amd, 0, None, 64, 64)];
        let v = visible_devices(&env(&[("CUDA_VISIBLE_DEVICES", "")]), &d);
        assert_eq!(v.devices.len(), 1);
        assert_eq!(v.devices[0].vendor, Vendor::Amd);
    }

    fn four_amd() -> Vec<GpuDevice> {
        (0..4).map(|i| device(Vendor::Amd, i, Some(&format!("GPU-{i:016x}")), 64, 64)).collect()
    }

    #[test]
    fn rocr_then_hip_pick_amd_devices() {
        let d = four_amd();
        assert_eq!(indices(&[("ROCR_VISIBLE_DEVICES", "3,1")], &d), [3, 1]);
        // HIP indexes what ROCr left: position 1 of [3, 1] is device 1.
        assert_eq!(indices(&[("ROCR_VISIBLE_DEVICES", "3,1"), ("HIP_VISIBLE_DEVICES", "1")], &d), [1]);
        assert_eq!(indices(&[("HIP_VISIBLE_DEVICES", "2,0")], &d), [2, 0]);
        assert_eq!(indices(&[("ROCR_VISIBLE_DEVICES", "GPU-0000000000000002")], &d), [2]);
        assert_eq!(indices(&[("ROCR_VISIBLE_DEVICES", "")], &d), Vec::<u32>::new());
        assert_eq!(indices(&[("ROCR_VISIBLE_DEVICES", "0,1"), ("HIP_VISIBLE_DEVICES", "2")], &d), Vec::<u32>::new());
    }

    #[test]
    fn slurm_allotment_applies_when_the_vendor_variable_is_unset() {
        let d = four_nvidia();
        assert_eq!(indices(&[("SLURM_JOB_GPUS", "1,3")], &d), [1, 3]);
        assert_eq!(indices(&[("SLURM_JOB_GPUS", "0-2")], &d), [0, 1, 2]);
        // The step's allotment wins over the job's.
        assert_eq!(indices(&[("SLURM_JOB_GPUS", "0,1,2,3"), ("SLURM_STEP_GPUS", "2")], &d), [2]);
        // CUDA_VISIBLE_DEVICES is what CUDA obeys, so it wins over SLURM's list.
        assert_eq!(indices(&[("SLURM_JOB_GPUS", "1,3"), ("CUDA_VISIBLE_DEVICES", "0")], &d), [0]);
        assert_eq!(indices(&[("SLURM_STEP_GPUS", "0,3")], &four_amd()), [0, 3]);
    }

    #[test]
    fn slurm_indices_hidden_by_the_cgroup_mean_all_probed_devices() {
        // The job got GPUs 2 and 3; its cgroup shows only them, renumbered 0 and 1.
        let d: Vec<GpuDevice> = four_nvidia().into_iter().take(2).collect();
        let v = visible_devices(&env(&[("SLURM_JOB_GPUS", "2,3")]), &d);
        assert_eq!(v.devices.len(), 2);
        assert!(v.notes[0].contains("cgroup"), "{:?}", v.notes);
        // Partly matching and more devices than entries: only the matches.
        assert_eq!(indices(&[("SLURM_JOB_GPUS", "3,9")], &four_nvidia()), [3]);
        // Unparsable: ignored, with a note.
        let v = visible_devices(&env(&[("SLURM_JOB_GPUS", "gpu:a")]), &four_nvidia());
        assert_eq!(v.devices.len(), 4);
        assert!(v.notes[0].contains("not a list of GPU indices"));
    }

    #[test]
    fn no_devices_probed_gives_none_whatever_the_environment() {
        for pairs in
            [&[][..], &[("CUDA_VISIBLE_DEVICES", "0,1")], &[("SLURM_JOB_GPUS", "0")], &[("HIP_VISIBLE_DEVICES", "0")]]
        {
            assert!(visible_devices(&env(pairs), &[]).devices.is_empty(), "{pairs:?}");
        }
    }

    #[test]
    fn slurm_lists_parse_ranges() {
        assert_eq!(parse_slurm_list("0,2-4"), Some(vec![0, 2, 3, 4]));
        assert_eq!(parse_slurm_list(""), Some(vec![]));
        assert_eq!(parse_slurm_list("3-1"), None);
        assert_eq!(parse_slurm_list("a"), None);
    }
}
