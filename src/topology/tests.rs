//! Tests against sysfs fixture trees built in a temp dir.

use std::fs;
use std::path::Path;

use super::*;
use crate::config::GpuNodePin;
use crate::tempdir::TempDir;

/// A throw-away sysfs root; removed on drop.
struct Fixture(TempDir);

impl Fixture {
    fn new() -> Fixture {
        Fixture(TempDir::new("topo"))
    }

    fn root(&self) -> &Path {
        self.0.path()
    }

    fn write(&self, rel: &str, content: &str) -> &Self {
        let path = self.0.path().join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, content).unwrap();
        self
    }

    fn pci(&self, bus_id: &str, vendor: &str, class: &str, numa_node: &str) -> &Self {
        let d = format!("bus/pci/devices/{bus_id}");
        self.write(&format!("{d}/vendor"), &format!("{vendor}\n"));
        self.write(&format!("{d}/class"), &format!("{class}\n"));
        self.write(&format!("{d}/numa_node"), &format!("{numa_node}\n"))
    }
}

/// cpus 0-1 on node 0, cpus 2-3 on node 1.
fn two_node_machine() -> Fixture {
    let fx = Fixture::new();
    fx.write("devices/system/cpu/online", "0-3\n");
    fx.write("devices/system/node/node0/cpulist", "0-1\n");
    fx.write("devices/system/node/node1/cpulist", "2-3\n");
    fx.write("devices/system/node/online", "0-1\n"); // not a nodeN dir: ignored
    fx
}

/// Two-node machine plus PCI devices, in a directory order unlike NVML's index order:
/// - 0000:3b:00.0 NVIDIA 3D controller on node 1, local_cpulist 2-3
/// - 0000:3b:00.1 NVIDIA HDMI audio (not a GPU)
/// - 0000:5e:00.0 Intel NIC (not a GPU)
/// - 0000:af:00.0 AMD VGA controller on node 0
/// - 0000:d8:00.0 NVIDIA 3D controller, numa_node -1 (unknown)
fn gpu_machine() -> Fixture {
    let fx = two_node_machine();
    fx.pci("0000:3b:00.0", "0x10de", "0x030200", "1").write("bus/pci/devices/0000:3b:00.0/local_cpulist", "2-3\n");
    fx.pci("0000:3b:00.1", "0x10de", "0x040300", "1");
    fx.pci("0000:5e:00.0", "0x8086", "0x020000", "0");
    fx.pci("0000:af:00.0", "0x1002", "0x030000", "0");
    fx.pci("0000:d8:00.0", "0x10de", "0x030200", "-1");
    fx
}

/// NVML's device list for gpu_machine(): index order differs from directory order.
const NVML_DEVICES: [(u32, &str); 3] = [(0, "00000000:D8:00.0"), (1, "00000000:3B:00.0"), (2, "00000000:AF:00.0")];

fn pins(toml_text: &str) -> TopologyConfig {
    toml::from_str(toml_text).unwrap()
}

#[test]
fn two_nodes() {
    let fx = two_node_machine();
    let t = Topology::read(fx.root()).unwrap();
    assert_eq!(t.nr_cpus(), 4);
    assert_eq!(t.nodes(), vec![0, 1]);
    assert_eq!(t.nr_nodes(), 2);
    assert_eq!(t.node_cpus(0), &[0, 1]);
    assert_eq!(t.node_cpus(1), &[2, 3]);
    assert_eq!(t.node_cpus(2), &[] as &[usize]);
    assert_eq!((0..4).map(|c| t.cpu_node(c).unwrap()).collect::<Vec<_>>(), vec![0, 0, 1, 1]);
    assert_eq!(t.cpu_node(4), None);
    assert!(t.gpus().is_empty());
}

#[test]
fn no_numa_dir_is_one_node() {
    let fx = Fixture::new();
    fx.write("devices/system/cpu/online", "0-2\n");
    let t = Topology::read(fx.root()).unwrap();
    assert_eq!(t.nodes(), vec![0]);
    assert_eq!(t.nr_nodes(), 1);
    assert_eq!(t.node_cpus(0), &[0, 1, 2]);
    assert_eq!(t.cpu_node(2), Some(0));
}

#[test]
fn memory_only_node_is_not_listed() {
    let fx = two_node_machine();
    fx.write("devices/system/node/node2/cpulist", "\n");
    let t = Topology::read(fx.root()).unwrap();
    assert_eq!(t.nodes(), vec![0, 1]);
    assert_eq!(t.nr_nodes(), 2);
}

#[test]
fn nr_nodes_covers_sparse_node_ids() {
    // Node 1 is offline: node ids 0 and 2 need arrays of 3.
    let fx = Fixture::new();
    fx.write("devices/system/cpu/online", "0-1\n");
    fx.write("devices/system/node/node0/cpulist", "0\n");
    fx.write("devices/system/node/node2/cpulist", "1\n");
    let t = Topology::read(fx.root()).unwrap();
    assert_eq!(t.nodes(), vec![0, 2]);
    assert_eq!(t.nr_nodes(), 3);
    assert_eq!(t.cpu_node(1), Some(2));
}

#[test]
fn garbage_and_missing_files_do_not_panic() {
    let fx = Fixture::new();
    // No cpu/online: the cpuN dirs are listed, and cpu1 is offline.
    for cpu in 0..3 {
        fx.write(&format!("devices/system/cpu/cpu{cpu}/online"), "1\n");
    }
    fx.write("devices/system/cpu/cpu1/online", "0\n");
    fx.write("devices/system/cpu/cpufreq/x", "");
    fx.write("devices/system/node/node0/cpulist", "zz\n");
    fx.write("devices/system/node/node1/cpulist", "2\n");
    fx.pci("0000:3b:00.0", "0x10de", "0x030200", "garbage");
    fx.pci("not-an-address", "0x10de", "0x030200", "0");
    fx.write("bus/pci/devices/0000:3c:00.0/vendor", "0x10de\n"); // no class
    let t = Topology::read(fx.root()).unwrap();
    assert_eq!(t.cpus().iter().map(|c| c.id).collect::<Vec<_>>(), vec![0, 2]);
    // node0's cpulist is garbage: cpu0 falls back to the lowest node, cpu2 is on node 1.
    assert_eq!(t.cpu_node(0), Some(0));
    assert_eq!(t.cpu_node(2), Some(1));
    assert_eq!(t.gpus().len(), 1);
    assert_eq!(t.gpus()[0].numa_node, None);
}

#[test]
fn no_cpu_is_an_error() {
    let fx = Fixture::new();
    assert!(Topology::read(fx.root()).is_err());
    fx.write("devices/system/cpu/online", "\n");
    assert!(Topology::read(fx.root()).is_err());
}

#[test]
fn finds_nvidia_and_amd_gpus_only() {
    let fx = gpu_machine();
    let t = Topology::read(fx.root()).unwrap();
    let found: Vec<(String, GpuVendor, u32, Option<usize>)> =
        t.gpus().iter().map(|g| (g.addr.to_string(), g.vendor, g.class, g.numa_node)).collect();
    assert_eq!(
        found,
        vec![
            ("0000:3b:00.0".to_string(), GpuVendor::Nvidia, 0x030200, Some(1)),
            ("0000:af:00.0".to_string(), GpuVendor::Amd, 0x030000, Some(0)),
            ("0000:d8:00.0".to_string(), GpuVendor::Nvidia, 0x030200, None),
        ]
    );
    assert_eq!(t.gpus()[0].local_cpus, vec![2, 3]);
    assert!(t.gpus()[1].local_cpus.is_empty());
}

#[test]
fn gpu_indices_come_from_the_device_list_not_directory_order() {
    let fx = gpu_machine();
    let mut t = Topology::read(fx.root()).unwrap();
    // Without a device list no index is known.
    assert_eq!(t.gpu_node(1), None);
    t.set_gpu_devices(&NVML_DEVICES);
    assert_eq!(t.gpu_addr(1).unwrap().to_string(), "0000:3b:00.0");
    assert_eq!(t.gpu_node(0), None); // 0000:d8:00.0 reports numa_node -1
    assert_eq!(t.gpu_node(1), Some(1)); // 0000:3b:00.0
    assert_eq!(t.gpu_node(2), Some(0)); // 0000:af:00.0
    assert_eq!(t.gpu_node(3), None);
    // A later list replaces the earlier one; an unparsable bus id is skipped.
    t.set_gpu_devices(&[(0, "00000000:AF:00.0".to_string()), (1, "bogus".to_string())]);
    assert_eq!(t.gpu_node(0), Some(0));
    assert_eq!(t.gpu_node(1), None);
}

#[test]
fn config_pins_unknown_gpu_and_wins_over_sysfs() {
    let fx = gpu_machine();
    let mut t = Topology::read(fx.root()).unwrap();
    t.set_gpu_devices(&NVML_DEVICES);
    // GPU 0 (numa_node -1) pinned by bus id in NVML spelling; GPU 2 (sysfs: node 0) by index.
    let cfg = pins(r#"gpu_node = [{ bus_id = "00000000:D8:00.0", node = 1 }, { gpu = 2, node = 1 }]"#);
    t.apply_config(&cfg).unwrap();
    assert_eq!(t.gpu_node(0), Some(1));
    assert_eq!(t.gpu_node(1), Some(1));
    assert_eq!(t.gpu_node(2), Some(1));
    // An index pin wins over a bus-id pin for the same GPU.
    let cfg = pins(r#"gpu_node = [{ bus_id = "0000:d8:00.0", node = 1 }, { gpu = 0, node = 0 }]"#);
    t.apply_config(&cfg).unwrap();
    assert_eq!(t.gpu_node(0), Some(0));
}

#[test]
fn vm_without_gpu_gets_node_from_config_alone() {
    let fx = two_node_machine();
    let mut t = Topology::read(fx.root()).unwrap();
    assert_eq!(t.gpu_node(0), None);
    t.apply_config(&pins("gpu_node = [{ gpu = 0, node = 1 }]")).unwrap();
    assert_eq!(t.gpu_node(0), Some(1));
    assert_eq!(t.preferred_node_for_gpus(&[0]), Some(1));
    assert_eq!(t.gpu_node(1), None);
}

#[test]
fn preferred_node_is_first_gpu_with_known_node() {
    let fx = gpu_machine();
    let mut t = Topology::read(fx.root()).unwrap();
    t.set_gpu_devices(&NVML_DEVICES);
    assert_eq!(t.preferred_node_for_gpus(&[0, 2, 1]), Some(0)); // GPU 0 unknown, GPU 2 on 0
    assert_eq!(t.preferred_node_for_gpus(&[1, 2]), Some(1));
    assert_eq!(t.preferred_node_for_gpus(&[0, 9]), None);
    assert_eq!(t.preferred_node_for_gpus(&[]), None);
}

#[test]
fn validate_names_the_key() {
    let fx = two_node_machine();
    let mut t = Topology::read(fx.root()).unwrap();
    let err = |text: &str| pins(text).validate(&t).unwrap_err();
    assert!(err("gpu_node = [{ gpu = 0, node = 2 }]").starts_with("topology.gpu_node[0].node = 2"));
    assert!(err(r#"gpu_node = [{ gpu = 0, node = 0 }, { bus_id = "3b:00.0", node = 1 }]"#)
        .starts_with("topology.gpu_node[1].bus_id"));
    assert!(err(r#"gpu_node = [{ gpu = 0, bus_id = "0000:3b:00.0", node = 1 }]"#)
        .contains("exactly one of `gpu` or `bus_id`"));
    assert!(err("gpu_node = [{ node = 1 }]").starts_with("topology.gpu_node[0]:"));
    assert!(err("gpu_node = [{ gpu = 1, node = 0 }, { gpu = 1, node = 1 }]").contains("already pinned by gpu_node[0]"));
    assert!(err(r#"gpu_node = [{ bus_id = "0000:3b:00.0", node = 0 }, { bus_id = "00000000:3B:00.0", node = 1 }]"#)
        .starts_with("topology.gpu_node[1].bus_id"));
    assert_eq!(TopologyConfig::default().validate(&t), Ok(()));
    // A rejected config leaves the earlier pins in place.
    t.apply_config(&pins("gpu_node = [{ gpu = 0, node = 1 }]")).unwrap();
    assert!(t.apply_config(&pins("gpu_node = [{ gpu = 0, node = 7 }]")).is_err());
    assert_eq!(t.gpu_node(0), Some(1));
}

#[test]
fn config_rejects_unknown_keys_and_defaults_to_empty() {
    assert_eq!(pins(""), TopologyConfig::default());
    assert!(toml::from_str::<TopologyConfig>("gpu_nodes = []").is_err());
    assert!(toml::from_str::<TopologyConfig>("gpu_node = [{ gpu = 0, node = 1, x = 2 }]").is_err());
    assert!(toml::from_str::<TopologyConfig>("gpu_node = [{ gpu = 0 }]").is_err());
    let cfg = pins(r#"gpu_node = [{ gpu = 3, node = 1 }, { bus_id = "0000:3b:00.0", node = 0 }]"#);
    assert_eq!(cfg.gpu_node[0], GpuNodePin { gpu: Some(3), bus_id: None, node: 1 });
    assert_eq!(cfg.gpu_node[1].bus_id.as_deref(), Some("0000:3b:00.0"));
    // Serialising (as `--dump-config` might) gives back the same config.
    assert_eq!(pins(&toml::to_string(&cfg).unwrap()), cfg);
}

#[test]
fn cpulist_parser() {
    assert_eq!(parse_cpulist("0-3,8,10-11\n"), Ok(vec![0, 1, 2, 3, 8, 10, 11]));
    assert_eq!(parse_cpulist("5"), Ok(vec![5]));
    assert_eq!(parse_cpulist("\n"), Ok(vec![]));
    assert_eq!(parse_cpulist("2,0-1,1"), Ok(vec![0, 1, 2]));
    assert!(parse_cpulist("3-1").is_err());
    assert!(parse_cpulist("a-b").is_err());
    assert!(parse_cpulist("0-4294967295").is_err());
}

#[test]
fn pci_addr_normalises_nvml_and_sysfs_spellings() {
    let nvml: PciAddr = "00000000:3B:00.0".parse().unwrap();
    let sysfs: PciAddr = "0000:3b:00.0\n".parse().unwrap();
    assert_eq!(nvml, sysfs);
    assert_eq!(nvml.to_string(), "0000:3b:00.0");
    assert_eq!("0001:AF:1f.7".parse::<PciAddr>().unwrap().to_string(), "0001:af:1f.7");
    assert_ne!("0001:3b:00.0".parse::<PciAddr>().unwrap(), sysfs);
    for bad in ["", "3b:00.0", "0000:3b:00", "0000:3b:20.0", "0000:3b:00.8", "0000:3bb:00.0", "x"] {
        assert!(bad.parse::<PciAddr>().is_err(), "{bad:?} parsed");
    }
}

#[test]
fn reads_this_machine() {
    if !Path::new("/sys/devices/system/cpu/online").exists() {
        return;
    }
    let t = Topology::read(Path::new(SYSFS_ROOT)).unwrap();
    assert!(t.nr_cpus() >= 1);
    for cpu in t.cpus() {
        assert!(t.node_cpus(cpu.node).contains(&cpu.id));
    }
    assert_eq!(t.nodes().iter().map(|&n| t.node_cpus(n).len()).sum::<usize>(), t.nr_cpus());
}
