package bpe

import (
	"runtime"
	"syscall"
	"unsafe"
)

const hugePage = 2 << 20

// allocTable returns zeroed memory for n values of type T, which holds no
// pointers, mapped outside the Go heap: aligned to 2 MiB and advised to use
// transparent huge pages where the system allows (the tables are read at
// random, and huge pages spare most TLB misses), and populated at once
// (MAP_POPULATE or writing one byte a page), which costs a fraction of a
// page fault per page. The memory is unmapped when owner, which must
// outlive every use of it, is unreachable.
func allocTable[T, O any](n int, owner *O) []T {
	var zero T
	size := n * int(unsafe.Sizeof(zero))
	if size == 0 {
		return nil
	}
	if size < hugePage {
		mem, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE,
			syscall.MAP_ANON|syscall.MAP_PRIVATE|syscall.MAP_POPULATE)
		if err != nil {
			return make([]T, n)
		}
		runtime.AddCleanup(owner, func(mem []byte) { syscall.Munmap(mem) }, mem)
		return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(mem))), n)
	}
	mem, err := syscall.Mmap(-1, 0, size+hugePage, syscall.PROT_READ|syscall.PROT_WRITE,
		syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return make([]T, n)
	}
	runtime.AddCleanup(owner, func(mem []byte) { syscall.Munmap(mem) }, mem)
	off := int(-uintptr(unsafe.Pointer(unsafe.SliceData(mem))) & (hugePage - 1))
	mem = mem[off : off+size]
	syscall.Madvise(mem, 14) // MADV_HUGEPAGE; an error leaves normal pages
	for i := 0; i < len(mem); i += 4096 {
		mem[i] = 0
	}
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(mem))), n)
}
