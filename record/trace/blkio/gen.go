package blkio

//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -cflags "-O2 -g -Wall -Werror -I../../../bpf/include" -target bpfel -type hist -type blk_key -type blk_stats -type blk_op -type drop_reason blkio ../../../bpf/blkio.bpf.c
