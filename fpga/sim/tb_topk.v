// File-driven testbench of topk_stream (dfvg/fpga/rtlsim drives it; no arithmetic here).
// Records: one int32 value per cycle from +in=FILE (binary, $fread), back to back; vectors of +n= beats.
// Every output writes K lines "T <rank> <index> <value>" (decimal, value signed) to +out=FILE, then
// "cycles <n>" (first beat to last output).
`timescale 1ns/1ps
module tb_topk #(
    parameter K     = 4,
    parameter IDX_W = 24
);
    reg clk = 0, rst = 1;
    always #5 clk = ~clk;
    reg  [31:0]      beat = 0;
    reg              in_valid = 0;
    reg  [1023:0]    f_in, f_out;
    integer          fb, fo, n_beats, n_vec, sent = 0, got = 0, cyc = 0, r, k;
    wire             in_last = (sent % n_vec) == 0;
    wire             out_valid;
    wire [IDX_W*K-1:0] out_index;
    wire [32*K-1:0]  out_value;

    topk_stream #(.K(K), .VAL_W(32), .IDX_W(IDX_W)) dut (.clk(clk), .rst(rst), .in_valid(in_valid),
        .in_last(in_last), .val(beat), .out_valid(out_valid), .out_index(out_index), .out_value(out_value));

    initial begin
        if (!$value$plusargs("beats=%d", n_beats) || !$value$plusargs("n=%d", n_vec)
            || !$value$plusargs("in=%s", f_in) || !$value$plusargs("out=%s", f_out))
            $fatal(1, "tb_topk: need +beats= +n= +in= +out=");
        fb = $fopen(f_in, "rb");
        fo = $fopen(f_out, "w");
        repeat (4) @(negedge clk);
        rst = 0;
    end

    always @(negedge clk) if (!rst) begin
        if (sent > 0) cyc = cyc + 1;
        if (out_valid) begin
            for (k = 0; k < K; k = k + 1)
                $fwrite(fo, "T %0d %0d %0d\n", k, out_index[IDX_W*k +: IDX_W], $signed(out_value[32*k +: 32]));
            got = got + 1;
        end
        if (sent < n_beats) begin
            r = $fread(beat, fb);
            in_valid = 1;
            sent = sent + 1;
        end else in_valid = 0;
        if (got * n_vec == n_beats) begin
            $fwrite(fo, "cycles %0d\n", cyc);
            $fclose(fo);
            $finish;
        end
    end
endmodule
