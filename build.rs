// Compiles src/bpf/main.bpf.c into a libbpf-rs skeleton and generates the
// Rust bindings for the structs and constants shared through src/bpf/intf.h.
fn main() {
    scx_cargo::BpfBuilder::new()
        .unwrap()
        .enable_intf("src/bpf/intf.h", "bpf_intf.rs")
        .enable_skel("src/bpf/main.bpf.c", "bpf")
        .build()
        .unwrap();
}
