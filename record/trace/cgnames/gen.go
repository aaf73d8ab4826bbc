package cgnames

//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -cflags "-O2 -g -Wall -Werror -I../../../bpf/include" -target bpfel -type cg_event -type cg_op -type drop_reason cgnames ../../../bpf/cgnames.bpf.c
