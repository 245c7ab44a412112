fn main() {
    eprintln!("taskfleet-sidecar: the worker loop is not implemented yet");
    std::process::exit(2);
}
