// File-driven testbench of the vector kernels; the kernel is chosen at compile time (iverilog -D):
//   NORM     rmsnorm_wide: record = x (W x 32), gamma (W x 16); rows of D/W beats; +mult +shift +eps
//   SOFTMAX  softmax_row:  record = scores (W x 32), row max (32), keep (W x 8, bit 0); rows of L/W beats;
//            +mult +shift
//   ROPE     rope:         record = x1 (W x 8), x2 (W x 8), cos (W x 16), sin (W x 16); output {o2, o1}
//   SWIGLU   swiglu:       record = gate (W x 8), up (W x 8); +mult +shift; the table from LUT_FILE
// Records (LSB first) come one per cycle from +in=FILE (binary, $fread), back to back; every output beat
// is written as "Y <hex>" to +out=FILE, then "cycles <n>" (first beat to last output). dfvg/fpga/rtlsim
// drives it; no arithmetic here.
`timescale 1ns/1ps
module tb_vector #(
    parameter D         = 16,
    parameter L         = 32,
    parameter W         = 8,
    parameter SEED_FILE = "rsqrt_seed.hex",
    parameter EXP_FILE  = "exp2.hex",
    parameter LUT_FILE  = "silu.hex"
);
`ifdef NORM
    localparam BR = 48 * W, ROW = D / W, OUT_W = 8 * W;
`elsif SOFTMAX
    localparam BR = 40 * W + 32, ROW = L / W, OUT_W = 16 * W;
`elsif ROPE
    localparam BR = 48 * W, ROW = 1, OUT_W = 16 * W;
`else
    localparam BR = 16 * W, ROW = 1, OUT_W = 8 * W;
`endif
    reg clk = 0, rst = 1;
    always #5 clk = ~clk;
    reg [BR-1:0]    beat = 0;
    reg             in_valid = 0;
    reg [14:0]      mult = 0;
    reg [5:0]       shift = 0;
    reg [31:0]      eps = 0;
    reg [1023:0]    f_in, f_out;
    integer         fb, fo, n_beats, sent = 0, got = 0, cyc = 0, r;
    wire            in_last = (sent % ROW) == 0;
    wire            out_valid;
    wire [OUT_W-1:0] out;

`ifdef NORM
    rmsnorm_wide #(.D(D), .W(W), .SEED_FILE(SEED_FILE)) dut (.clk(clk), .rst(rst), .in_valid(in_valid),
        .in_last(in_last), .x(beat[0 +: 32*W]), .gamma(beat[32*W +: 16*W]), .mult(mult), .shift(shift),
        .eps0(eps), .out_valid(out_valid), .out_last(), .y(out));
`elsif SOFTMAX
    wire [W-1:0] keep;
    genvar g;
    for (g = 0; g < W; g = g + 1) begin : k
        assign keep[g] = beat[32*W + 32 + 8*g];
    end
    softmax_row #(.L(L), .W(W), .D_W(32), .EXP_FILE(EXP_FILE), .SEED_FILE(SEED_FILE)) dut (.clk(clk),
        .rst(rst), .in_valid(in_valid), .in_last(in_last), .s(beat[0 +: 32*W]), .keep(keep),
        .smax(beat[32*W +: 32]), .mult(mult), .shift(shift), .out_valid(out_valid), .out_last(), .p(out));
`elsif ROPE
    rope #(.W(W)) dut (.clk(clk), .rst(rst), .in_valid(in_valid), .x1(beat[0 +: 8*W]), .x2(beat[8*W +: 8*W]),
        .cos_q(beat[16*W +: 16*W]), .sin_q(beat[32*W +: 16*W]), .out_valid(out_valid), .o1(out[0 +: 8*W]),
        .o2(out[8*W +: 8*W]));
`else
    swiglu #(.W(W), .LUT_FILE(LUT_FILE)) dut (.clk(clk), .rst(rst), .in_valid(in_valid), .gate(beat[0 +: 8*W]),
        .up(beat[8*W +: 8*W]), .mult(mult), .shift(shift), .out_valid(out_valid), .y(out));
`endif

    initial begin
        if (!$value$plusargs("beats=%d", n_beats) || !$value$plusargs("in=%s", f_in)
            || !$value$plusargs("out=%s", f_out))
            $fatal(1, "tb_vector: need +beats= +in= +out=");
        r = $value$plusargs("mult=%d", mult) + $value$plusargs("shift=%d", shift) + $value$plusargs("eps=%d", eps);
        fb = $fopen(f_in, "rb");
        fo = $fopen(f_out, "w");
        repeat (4) @(negedge clk);
        rst = 0;
    end

    always @(negedge clk) if (!rst) begin
        if (sent > 0) cyc = cyc + 1;
        if (out_valid) begin $fwrite(fo, "Y %h\n", out); got = got + 1; end
        if (sent < n_beats) begin
            r = $fread(beat, fb);
            in_valid = 1;
            sent = sent + 1;
        end else in_valid = 0;
        if (got == n_beats) begin
            $fwrite(fo, "cycles %0d\n", cyc);
            $fclose(fo);
            $finish;
        end
    end
endmodule
