package runq

//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -cflags "-O2 -g -Wall -Werror -I../../../bpf/include" -target bpfel -type hist -type pair_key -type pair_val -type drop_reason -type wait_kind -type slot -type slot_pair -type pair_sum -type cgroup_sum runq ../../../bpf/runq.bpf.c
