package fsync

//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -cflags "-O2 -g -Wall -Werror -I../../../bpf/include" -target bpfel -type hist -type fsync_key -type fsync_syscall -type drop_reason fsync ../../../bpf/fsync.bpf.c
