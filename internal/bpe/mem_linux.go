package bpe

import (
	"runtime"
	"syscall"
	"unsafe"
)

// allocTable returns zeroed memory for n values of type T, which holds no
// pointers, mapped with its pages populated at once (MAP_POPULATE): the
// tables are large and written right after allocation, and populating them
// in one call costs a fraction of a page fault per page. The memory is
// unmapped when owner, which must outlive every use of it, is unreachable.
func allocTable[T, O any](n int, owner *O) []T {
	var zero T
	size := n * int(unsafe.Sizeof(zero))
	if size == 0 {
		return nil
	}
	mem, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE,
		syscall.MAP_ANON|syscall.MAP_PRIVATE|syscall.MAP_POPULATE)
	if err != nil {
		return make([]T, n)
	}
	runtime.AddCleanup(owner, func(mem []byte) { syscall.Munmap(mem) }, mem)
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(mem))), n)
}
