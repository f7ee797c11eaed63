//! Guest memory for the test frontend: one memfd-backed region, shared with
//! the device through SET_MEM_TABLE, plus bounds-checked accessors.
//!
//! The device (another process) reads and writes this memory concurrently.
//! Every access here goes through a raw pointer into the mapping with volatile
//! or atomic semantics, never through a Rust reference to plain data, so the
//! compiler makes no assumption about the contents staying put.

use std::fs::File;
use std::io;
use std::os::fd::FromRawFd;
use std::sync::atomic::{AtomicU16, Ordering};

use vhost::VhostUserMemoryRegionInfo;
use vm_memory::{FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

/// One region of guest memory backed by a memfd.
pub struct GuestMem {
    mem: GuestMemoryMmap,
    base: u64,
    size: u64,
    /// Host virtual address of `base` in this process.
    host: usize,
}

impl std::fmt::Debug for GuestMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuestMem")
            .field("base", &format_args!("{:#x}", self.base))
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

impl GuestMem {
    /// Create `size` bytes of guest memory at guest-physical address `base`.
    pub fn new(base: u64, size: usize) -> io::Result<Self> {
        // SAFETY: memfd_create takes a NUL-terminated name and flags; the
        // returned fd (checked below) is owned by nobody else.
        let fd = unsafe { libc::memfd_create(c"vnic-frontend-mem".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh, valid descriptor that we own exclusively.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(size as u64)?;
        let mem = GuestMemoryMmap::<()>::from_ranges_with_files([(
            GuestAddress(base),
            size,
            Some(FileOffset::new(file, 0)),
        )])
        .map_err(|e| io::Error::other(format!("mapping guest memory: {e:?}")))?;
        let host = mem
            .get_host_address(GuestAddress(base))
            .map_err(|e| io::Error::other(format!("host address of guest memory: {e:?}")))?
            as usize;
        Ok(GuestMem {
            mem,
            base,
            size: size as u64,
            host,
        })
    }

    /// The region description for SET_MEM_TABLE / ADD_MEM_REG.
    pub fn region_info(&self) -> VhostUserMemoryRegionInfo {
        let region = self.mem.iter().next().expect("one region");
        VhostUserMemoryRegionInfo::from_guest_region(region).expect("region has a file offset")
    }

    /// First guest-physical address of the region.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Size of the region in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// One past the last guest-physical address.
    pub fn end(&self) -> u64 {
        self.base + self.size
    }

    /// Whether `[gpa, gpa + len)` lies inside guest memory.
    pub fn contains(&self, gpa: u64, len: u64) -> bool {
        gpa >= self.base && gpa.checked_add(len).is_some_and(|e| e <= self.end())
    }

    /// Frontend virtual address of `gpa` (what SET_VRING_ADDR carries).
    pub fn host_addr(&self, gpa: u64) -> u64 {
        assert!(self.contains(gpa, 1), "gpa {gpa:#x} outside guest memory");
        (self.host as u64) + (gpa - self.base)
    }

    /// Pointer to `[gpa, gpa+len)`; panics (a bug in the test driver, not
    /// in the device) when the range is outside guest memory.
    fn ptr(&self, gpa: u64, len: usize) -> *mut u8 {
        assert!(
            self.contains(gpa, len as u64),
            "access {gpa:#x}+{len} outside guest memory"
        );
        (self.host + (gpa - self.base) as usize) as *mut u8
    }

    /// Copy `data` into guest memory at `gpa`.
    pub fn write(&self, gpa: u64, data: &[u8]) {
        let p = self.ptr(gpa, data.len());
        // SAFETY: `ptr` checked that the whole destination range lies in our
        // live mapping (owned by `self.mem`); `data` is a distinct Rust
        // buffer, so the ranges cannot overlap.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p, data.len()) };
    }

    /// Copy guest memory at `gpa` into `out`.
    pub fn read(&self, gpa: u64, out: &mut [u8]) {
        let p = self.ptr(gpa, out.len());
        // SAFETY: as in `write`, the source range is inside the mapping and
        // `out` is a separate Rust buffer.
        unsafe { std::ptr::copy_nonoverlapping(p, out.as_mut_ptr(), out.len()) };
    }

    /// Fill `[gpa, gpa+len)` with `byte`.
    pub fn fill(&self, gpa: u64, len: usize, byte: u8) {
        let p = self.ptr(gpa, len);
        // SAFETY: the range is inside the mapping (checked by `ptr`).
        unsafe { std::ptr::write_bytes(p, byte, len) };
    }

    /// Little-endian volatile store of a u16.
    pub fn write_u16(&self, gpa: u64, v: u16) {
        let p = self.ptr(gpa, 2).cast::<[u8; 2]>();
        // SAFETY: the 2-byte range is inside the mapping; `[u8; 2]` has
        // alignment 1, so any address is fine.
        unsafe { p.write_volatile(v.to_le_bytes()) };
    }

    /// Little-endian volatile store of a u32.
    pub fn write_u32(&self, gpa: u64, v: u32) {
        let p = self.ptr(gpa, 4).cast::<[u8; 4]>();
        // SAFETY: in range (checked), byte arrays need no alignment.
        unsafe { p.write_volatile(v.to_le_bytes()) };
    }

    /// Little-endian volatile store of a u64.
    pub fn write_u64(&self, gpa: u64, v: u64) {
        let p = self.ptr(gpa, 8).cast::<[u8; 8]>();
        // SAFETY: in range (checked), byte arrays need no alignment.
        unsafe { p.write_volatile(v.to_le_bytes()) };
    }

    /// Little-endian volatile load of a u16.
    pub fn read_u16(&self, gpa: u64) -> u16 {
        let p = self.ptr(gpa, 2).cast::<[u8; 2]>();
        // SAFETY: in range (checked), byte arrays need no alignment.
        u16::from_le_bytes(unsafe { p.read_volatile() })
    }

    /// Little-endian volatile load of a u32.
    pub fn read_u32(&self, gpa: u64) -> u32 {
        let p = self.ptr(gpa, 4).cast::<[u8; 4]>();
        // SAFETY: in range (checked), byte arrays need no alignment.
        u32::from_le_bytes(unsafe { p.read_volatile() })
    }

    /// Little-endian volatile load of a u64.
    pub fn read_u64(&self, gpa: u64) -> u64 {
        let p = self.ptr(gpa, 8).cast::<[u8; 8]>();
        // SAFETY: in range (checked), byte arrays need no alignment.
        u64::from_le_bytes(unsafe { p.read_volatile() })
    }

    // The alignment is asserted at run time just above the cast.
    #[allow(clippy::cast_ptr_alignment)]
    fn atomic_u16(&self, gpa: u64) -> &AtomicU16 {
        assert!(gpa.is_multiple_of(2), "unaligned ring index at {gpa:#x}");
        let p = self.ptr(gpa, 2).cast::<u16>();
        // SAFETY: the address is inside the mapping, 2-byte aligned (checked;
        // the mapping itself is page aligned), and lives as long as `self`.
        // The only other accessor is the device, which uses atomic accesses
        // on ring indexes as virtio requires. Little-endian host assumed
        // (x86_64/aarch64), matching virtio's little-endian layout.
        unsafe { AtomicU16::from_ptr(p) }
    }

    /// Load a ring index with acquire ordering (pairs with the device's
    /// release store of used.idx).
    pub fn load_u16_acquire(&self, gpa: u64) -> u16 {
        self.atomic_u16(gpa).load(Ordering::Acquire)
    }

    /// Store a ring index with release ordering (publishes the ring entries
    /// written before it).
    pub fn store_u16_release(&self, gpa: u64, v: u16) {
        self.atomic_u16(gpa).store(v, Ordering::Release);
    }
}
