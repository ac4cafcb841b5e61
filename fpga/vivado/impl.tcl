# Vivado place and route of each synthesized kernel (untested here: no Vivado).
# Usage (from build/vivado, after synth.tcl): vivado -mode batch -source impl.tcl
# For every <kernel>_synth.dcp: place_design, phys_opt_design, route_design, utilization and timing
# reports. Out-of-context kernels have no pins, so write_bitstream is only run for a full top
# (set DFVG_FULL_TOP=<name>); on an Alveo card the bitstream instead comes from linking the packaged
# kernels against the shell with `v++ --link` (make xclbin), which places the shell's static region.
source kernels.tcl

dict for {name spec} $kernels {
    open_checkpoint ${name}_synth.dcp
    place_design
    phys_opt_design
    route_design
    report_utilization -file ${name}_utilization.rpt
    report_timing_summary -max_paths 10 -file ${name}_timing_summary.rpt
    write_checkpoint -force ${name}_routed.dcp
    if {[info exists ::env(DFVG_FULL_TOP)] && $::env(DFVG_FULL_TOP) eq $name} {
        write_bitstream -force ${name}.bit
    } else {
        puts "DFVG: $name is out of context: no bitstream (see make xclbin)"
    }
    close_design
}
