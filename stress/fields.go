package stress

// Names of a run's settings in its errors (badvalue.Error's Field), as the scenarios' configs
// call them; the CLI names the flag that set each instead.
const (
	FieldHogs       = "Hogs"
	FieldHeartbeat  = "Heartbeat"
	FieldCPULimits  = "CPULimits"
	FieldTimeout    = "Timeout"
	FieldTrace      = "Trace"
	FieldTarget     = "Target"
	FieldNodeMemory = "NodeMemory"
	FieldSwapFile   = "SwapFile"
)
