package bpe

import (
	"syscall"
	"unsafe"
)

// hugePage is the size of a transparent huge page on the platforms that
// matter (x86-64, arm64 with 4 KiB pages).
const hugePage = 2 << 20

// allocTable returns a zeroed slice of n values of type T, which must hold
// no pointers and have a size dividing the page size. A table of several
// huge pages is placed on 2 MiB boundaries and advised to use transparent
// huge pages where the system allows: the rank table is written right after
// allocation and read at random, and huge pages spare thousands of page
// faults on loading and most TLB misses later.
func allocTable[T any](n int) []T {
	var zero T
	size := int(unsafe.Sizeof(zero))
	if n*size < 2*hugePage {
		return make([]T, n)
	}
	buf := make([]T, n+hugePage/size)
	off := int(-uintptr(unsafe.Pointer(unsafe.SliceData(buf)))&(hugePage-1)) / size
	t := buf[off : off+n : off+n]
	syscall.Madvise(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(t))), n*size), 14) // MADV_HUGEPAGE; on error, normal pages
	return t
}
