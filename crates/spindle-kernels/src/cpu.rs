//! Facts about the processor the pool runs on.

use std::collections::HashSet;

/// Physical cores this process may run on: distinct (package, core) pairs of
/// the allowed logical CPUs. Hyper-threads share a core's arithmetic units,
/// so the default thread count is this, not the logical count. Falls back to
/// the logical count where the topology cannot be read.
pub fn physical_cores() -> usize {
    let logical = std::thread::available_parallelism().map_or(1, |n| n.get());
    let Ok(entries) = std::fs::read_dir("/sys/devices/system/cpu") else {
        return logical;
    };
    let allowed = allowed_cpus();
    let mut cores = HashSet::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(id) = name
            .strip_prefix("cpu")
            .and_then(|n| n.parse::<usize>().ok())
        else {
            continue;
        };
        if allowed.as_ref().is_some_and(|a| !a.contains(&id)) {
            continue;
        }
        let read = |f: &str| std::fs::read_to_string(e.path().join("topology").join(f)).ok();
        if let (Some(pkg), Some(core)) = (read("physical_package_id"), read("core_id")) {
            cores.insert((pkg.trim().to_string(), core.trim().to_string()));
        }
    }
    if cores.is_empty() {
        logical
    } else {
        cores.len().min(logical)
    }
}

/// CPUs in this process's affinity mask (Linux `Cpus_allowed_list`).
fn allowed_cpus() -> Option<HashSet<usize>> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?
        .trim()
        .to_string();
    let mut set = HashSet::new();
    for part in list.split(',') {
        match part.split_once('-') {
            Some((a, b)) => {
                set.extend(a.trim().parse::<usize>().ok()?..=b.trim().parse::<usize>().ok()?)
            }
            None => {
                set.insert(part.trim().parse::<usize>().ok()?);
            }
        }
    }
    Some(set)
}

#[cfg(test)]
mod tests {
    #[test]
    fn at_least_one_and_at_most_logical() {
        let p = super::physical_cores();
        let l = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert!(p >= 1 && p <= l, "physical {p}, logical {l}");
    }
}
