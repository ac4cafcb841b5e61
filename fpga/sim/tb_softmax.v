// File-driven testbench of softmax_row (one attention row per L/W beats, back to back).
// +in: one record per beat, LSB first: scores (W x 32), row max (32), keep (W x 8, low bit used).
// +mult +shift: the layer's softmax constants. Output lines "P <hex Q0.15 lanes>", then "cycles <n>".
`timescale 1ns/1ps
module tb_softmax #(
    parameter L         = 32,
    parameter W         = 8,
    parameter EXP_FILE  = "exp2.hex",
    parameter SEED_FILE = "recip_seed.hex"
);
    localparam BR = 40 * W + 32;
    reg clk = 0, rst = 1;
    always #5 clk = ~clk;
    reg [BR-1:0] beat = 0;
    reg          in_valid = 0;
    reg [14:0]   mult;
    reg [5:0]    shift;
    reg [1023:0] f_in, f_out;
    integer fb, fo, n_beats, sent = 0, got = 0, cyc = 0, r;
    wire         out_valid, out_last;
    wire [16*W-1:0] p;
    wire [W-1:0] keep;
    genvar g;
    generate
        for (g = 0; g < W; g = g + 1) begin : k
            assign keep[g] = beat[32*W + 32 + 8*g];
        end
    endgenerate
    softmax_row #(.L(L), .W(W), .D_W(32), .EXP_FILE(EXP_FILE), .SEED_FILE(SEED_FILE)) dut (.clk(clk),
        .rst(rst), .in_valid(in_valid), .in_last(sent % (L / W) == 0), .s(beat[0 +: 32*W]), .keep(keep),
        .smax(beat[32*W +: 32]), .mult(mult), .shift(shift), .out_valid(out_valid), .out_last(out_last),
        .p(p));

    initial begin
        if (!$value$plusargs("beats=%d", n_beats) || !$value$plusargs("mult=%d", mult)
            || !$value$plusargs("shift=%d", shift) || !$value$plusargs("in=%s", f_in)
            || !$value$plusargs("out=%s", f_out))
            $fatal(1, "tb_softmax: need +beats= +mult= +shift= +in= +out=");
        fb = $fopen(f_in, "rb");
        fo = $fopen(f_out, "w");
        repeat (4) @(negedge clk);
        rst = 0;
    end

    always @(negedge clk) if (!rst) begin
        if (sent > 0) cyc = cyc + 1;
        if (out_valid) begin $fwrite(fo, "P %h\n", p); got = got + 1; end
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
