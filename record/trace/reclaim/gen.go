package reclaim

//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -cflags "-O2 -g -Wall -Werror -I../../../bpf/include" -target bpfel -type hist -type stall_key -type stall_val -type oom_kill -type stall_kind -type counter -type drop_reason reclaim ../../../bpf/reclaim.bpf.c
