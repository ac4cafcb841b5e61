// File-driven testbench of rope: one (x1, x2) half-pair vector of W lanes per beat.
// +in: one record per beat, LSB first: x1 (W x 8), x2 (W x 8), cos (W x 16), sin (W x 16), Q1.14.
// Output lines "R <hex o2 lanes><hex o1 lanes>" (o2 in the high half), then "cycles <n>".
`timescale 1ns/1ps
module tb_rope #(
    parameter W = 8
);
    localparam BR = 48 * W;
    reg clk = 0, rst = 1;
    always #5 clk = ~clk;
    reg [BR-1:0] beat = 0;
    reg          in_valid = 0;
    reg [1023:0] f_in, f_out;
    integer fb, fo, n_beats, sent = 0, got = 0, cyc = 0, r;
    wire         out_valid;
    wire [8*W-1:0] o1, o2;
    rope #(.W(W)) dut (.clk(clk), .rst(rst), .in_valid(in_valid), .x1(beat[0 +: 8*W]), .x2(beat[8*W +: 8*W]),
        .cos_q(beat[16*W +: 16*W]), .sin_q(beat[32*W +: 16*W]), .out_valid(out_valid), .o1(o1), .o2(o2));

    initial begin
        if (!$value$plusargs("beats=%d", n_beats) || !$value$plusargs("in=%s", f_in)
            || !$value$plusargs("out=%s", f_out))
            $fatal(1, "tb_rope: need +beats= +in= +out=");
        fb = $fopen(f_in, "rb");
        fo = $fopen(f_out, "w");
        repeat (4) @(negedge clk);
        rst = 0;
    end

    always @(negedge clk) if (!rst) begin
        if (sent > 0) cyc = cyc + 1;
        if (out_valid) begin $fwrite(fo, "R %h%h\n", o2, o1); got = got + 1; end
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
