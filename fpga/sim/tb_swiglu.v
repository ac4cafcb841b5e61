// File-driven testbench of swiglu: W (gate, up) int8 lanes per beat; the layer's SiLU table from +lut.
// +in: one record per beat, LSB first: gate (W x 8), up (W x 8). +mult +shift: the hidden requant.
// Output lines "H <hex int8 lanes>", then "cycles <n>".
`timescale 1ns/1ps
module tb_swiglu #(
    parameter W        = 8,
    parameter LUT_FILE = "silu.hex"
);
    localparam BR = 16 * W;
    reg clk = 0, rst = 1;
    always #5 clk = ~clk;
    reg [BR-1:0] beat = 0;
    reg          in_valid = 0;
    reg [14:0]   mult;
    reg [5:0]    shift;
    reg [1023:0] f_in, f_out;
    integer fb, fo, n_beats, sent = 0, got = 0, cyc = 0, r;
    wire         out_valid;
    wire [8*W-1:0] y;
    swiglu #(.W(W), .LUT_FILE(LUT_FILE)) dut (.clk(clk), .rst(rst), .in_valid(in_valid), .gate(beat[0 +: 8*W]),
        .up(beat[8*W +: 8*W]), .mult(mult), .shift(shift), .out_valid(out_valid), .y(y));

    initial begin
        if (!$value$plusargs("beats=%d", n_beats) || !$value$plusargs("mult=%d", mult)
            || !$value$plusargs("shift=%d", shift) || !$value$plusargs("in=%s", f_in)
            || !$value$plusargs("out=%s", f_out))
            $fatal(1, "tb_swiglu: need +beats= +mult= +shift= +in= +out=");
        fb = $fopen(f_in, "rb");
        fo = $fopen(f_out, "w");
        repeat (4) @(negedge clk);
        rst = 0;
    end

    always @(negedge clk) if (!rst) begin
        if (sent > 0) cyc = cyc + 1;
        if (out_valid) begin $fwrite(fo, "H %h\n", y); got = got + 1; end
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
