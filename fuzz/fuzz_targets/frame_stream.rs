#![no_main]

#[global_allocator]
static ALLOCATOR: rowsync_server::fuzzing::CountingAllocator =
    rowsync_server::fuzzing::CountingAllocator;

libfuzzer_sys::fuzz_target!(|data: &[u8]| rowsync_server::fuzzing::frame_stream(data));
