// File-driven testbench of rmsnorm_wide (the int32-residual RMSNorm; also Qwen3's q/k norm).
// +in: one record per beat, LSB first: x (W x 32), gamma (W x 16); rows of D/W beats back to back.
// +mult +shift +eps: the layer's constants. Output lines "Y <hex int8 lanes>", then "cycles <n>".
`timescale 1ns/1ps
module tb_norm #(
    parameter D         = 16,
    parameter W         = 4,
    parameter SEED_FILE = "rsqrt_seed.hex"
);
    localparam BR = 48 * W;
    reg clk = 0, rst = 1;
    always #5 clk = ~clk;
    reg [BR-1:0] beat = 0;
    reg          in_valid = 0;
    reg [14:0]   mult;
    reg [5:0]    shift;
    reg [31:0]   eps;
    reg [1023:0] f_in, f_out;
    integer fb, fo, n_beats, sent = 0, got = 0, cyc = 0, r;
    wire         out_valid, out_last;
    wire [8*W-1:0] y;
    rmsnorm_wide #(.D(D), .W(W), .SEED_FILE(SEED_FILE)) dut (.clk(clk), .rst(rst), .in_valid(in_valid),
        .in_last(sent % (D / W) == 0), .x(beat[0 +: 32*W]), .gamma(beat[32*W +: 16*W]), .mult(mult),
        .shift(shift), .eps0(eps), .out_valid(out_valid), .out_last(out_last), .y(y));

    initial begin
        if (!$value$plusargs("beats=%d", n_beats) || !$value$plusargs("mult=%d", mult)
            || !$value$plusargs("shift=%d", shift) || !$value$plusargs("eps=%d", eps)
            || !$value$plusargs("in=%s", f_in) || !$value$plusargs("out=%s", f_out))
            $fatal(1, "tb_norm: need +beats= +mult= +shift= +eps= +in= +out=");
        fb = $fopen(f_in, "rb");
        fo = $fopen(f_out, "w");
        repeat (4) @(negedge clk);
        rst = 0;
    end

    always @(negedge clk) if (!rst) begin
        if (sent > 0) cyc = cyc + 1;
        if (out_valid) begin $fwrite(fo, "Y %h\n", y); got = got + 1; end
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
