# Vivado synthesis of the DFVG draft kernels for the Alveo U280 part (untested here: no Vivado).
# Usage (from build/vivado, see Makefile): vivado -mode batch -source synth.tcl -tclargs PART RTL_DIR LUT_DIR
# Each kernel is synthesized out of context (it is a block of a larger design, its ports are not pins)
# with the same sizes as `make synth-oss` (kernels.tcl, written from scripts/kernels.py), then
# opt_design; a checkpoint and a utilization report per kernel are written for impl.tcl.
lassign $argv part rtl_dir lut_dir
source kernels.tcl   ;# defines the dict `kernels`: name -> {top files generics}

foreach hex [glob -nocomplain [file join $lut_dir *.hex]] {
    file copy -force $hex .   ;# $readmemh paths are relative to the run directory
}

dict for {name spec} $kernels {
    set top [dict get $spec top]
    close_project -quiet
    create_project -in_memory -part $part
    foreach f [dict get $spec files] {
        read_verilog [file join $rtl_dir $f]
    }
    set generics {}
    dict for {k v} [dict get $spec generics] {
        lappend generics -generic "$k=$v"
    }
    synth_design -top $top -part $part -mode out_of_context {*}$generics
    create_clock -name clk -period 3.333 [get_ports clk]   ;# 300 MHz target, an assumption
    opt_design
    write_checkpoint -force ${name}_synth.dcp
    report_utilization -file ${name}_synth_utilization.rpt
    puts "DFVG: synthesized $name"
}
