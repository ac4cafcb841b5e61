// File-driven testbench of one GEMV job list (dfvg/fpga/rtlsim drives it; no arithmetic here).
// Beats come from +beats=FILE (binary records, one per cycle, no gaps); per-tile lane constants from
// +consts=FILE, read when the tile's accumulators appear. Datapath: gemv_tile (int8 or Q0.15 x int8)
// or gemv_int4 (INT4 = 1) -> P requant lanes (int8 out) and P requant32 lanes (int32 out, + residual)
// -> argmax_stream over the int32 lanes (rows past a tile's valid count read as INT32_MIN).
// Beat record, LSB first: x (W lanes of 32 bits, low X_W used), w (P*W lanes of WB bits),
// gs (P x 8 bits, int4 group scales), flags (8 bits: 0 = tile last, 1 = group last).
// Const record, LSB first: bias (P x 32), mult (P x 16), shift (P x 8), res (P x 32), valid lanes (16),
// job last (8), pad (8). Output lines: "B <hex int8 lanes>", "C <hex int32 lanes>", "M <index> <value>",
// then "cycles <n>" (first beat to last output).
`timescale 1ns/1ps
module tb_gemv #(
    parameter P     = 4,
    parameter W     = 8,
    parameter X_W   = 8,
    parameter ACC_W = 32,
    parameter INT4  = 0
);
    localparam WB = INT4 ? 4 : 8;
    localparam BR = 32 * W + WB * P * W + 8 * P + 8;
    localparam CR = 88 * P + 32;
    localparam AW = INT4 ? 48 : ACC_W;

    reg clk = 0, rst = 1;
    always #5 clk = ~clk;
    reg [BR-1:0] beat = 0;
    reg [CR-1:0] cst = 0;
    reg          in_valid = 0;
    integer fb, fc, fo, n_beats, n_tiles, n_jobs, sent = 0, got8 = 0, got32 = 0, gotm = 0, cyc = 0, r;

    wire [X_W*W-1:0]  x;
    wire              in_last = beat[BR-8], in_glast = beat[BR-7];
    wire              acc_valid;
    wire [AW*P-1:0]   acc;
    genvar g;
    generate
        for (g = 0; g < W; g = g + 1) begin : xl
            assign x[X_W*g +: X_W] = beat[32*g +: X_W];
        end
        if (INT4) begin : t4
            gemv_int4 #(.P(P), .W(W)) dut (.clk(clk), .rst(rst), .in_valid(in_valid), .in_glast(in_glast),
                .in_last(in_last), .x(x), .w(beat[32*W +: 4*P*W]), .gs(beat[32*W + 4*P*W +: 8*P]),
                .acc_valid(acc_valid), .acc(acc));
        end else begin : t8
            gemv_tile #(.P(P), .W(W), .X_W(X_W), .ACC_W(ACC_W)) dut (.clk(clk), .rst(rst),
                .in_valid(in_valid), .in_last(in_last), .x(x), .w(beat[32*W +: 8*P*W]), .bias({32*P{1'b0}}),
                .mult({15*P{1'b0}}), .shift({6*P{1'b0}}), .acc_valid(acc_valid), .acc(acc), .out_valid(),
                .y());
        end
    endgenerate

    wire [P-1:0]   v8, v32;
    wire [8*P-1:0] y8;
    wire [32*P-1:0] y32, am_in;
    reg  [15:0]    nvalid_d [0:3];
    reg  [3:0]     jlast_d;
    always @(posedge clk) begin
        nvalid_d[0] <= cst[88*P +: 16]; nvalid_d[1] <= nvalid_d[0];
        nvalid_d[2] <= nvalid_d[1]; nvalid_d[3] <= nvalid_d[2];
        jlast_d <= {jlast_d[2:0], cst[88*P + 16]};
    end
    generate
        for (g = 0; g < P; g = g + 1) begin : lane
            requant #(.ACC_W(AW)) rq8 (.clk(clk), .in_valid(acc_valid), .acc(acc[AW*g +: AW]),
                .bias(cst[32*g +: 32]), .mult(cst[32*P + 16*g +: 15]), .shift(cst[48*P + 8*g +: 6]),
                .out_valid(v8[g]), .y(y8[8*g +: 8]));
            requant32 #(.ACC_W(AW)) rq32 (.clk(clk), .in_valid(acc_valid), .acc(acc[AW*g +: AW]),
                .bias(cst[32*g +: 32]), .mult(cst[32*P + 16*g +: 15]), .shift(cst[48*P + 8*g +: 6]),
                .res(cst[56*P + 32*g +: 32]), .out_valid(v32[g]), .y(y32[32*g +: 32]));
            assign am_in[32*g +: 32] = (g < nvalid_d[3]) ? y32[32*g +: 32] : 32'h8000_0000;
        end
    endgenerate
    wire        am_valid;
    wire [31:0] am_index, am_value;
    argmax_stream #(.W(P), .VAL_W(32), .IDX_W(32)) am (.clk(clk), .rst(rst), .in_valid(v32[0]),
        .in_last(jlast_d[3]), .vals(am_in), .out_valid(am_valid), .out_index(am_index), .out_value(am_value));

    reg [1023:0] f_in, f_consts, f_out;
    initial begin
        if (!$value$plusargs("beats=%d", n_beats) || !$value$plusargs("tiles=%d", n_tiles)
            || !$value$plusargs("jobs=%d", n_jobs) || !$value$plusargs("in=%s", f_in)
            || !$value$plusargs("consts=%s", f_consts) || !$value$plusargs("out=%s", f_out))
            $fatal(1, "tb_gemv: need +beats= +tiles= +jobs= +in= +consts= +out=");
        fb = $fopen(f_in, "rb");
        fc = $fopen(f_consts, "rb");
        fo = $fopen(f_out, "w");
        repeat (4) @(negedge clk);
        rst = 0;
    end

    // all tb activity on the falling edge: inputs settle before the kernel's rising edge
    always @(negedge clk) if (!rst) begin
        if (sent > 0 || in_valid) cyc = cyc + 1;
        if (acc_valid) r = $fread(cst, fc);
        if (v8[0]) begin $fwrite(fo, "B %h\n", y8); got8 = got8 + 1; end
        if (v32[0]) begin $fwrite(fo, "C %h\n", y32); got32 = got32 + 1; end
        if (am_valid) begin $fwrite(fo, "M %0d %0d\n", am_index, $signed(am_value)); gotm = gotm + 1; end
        if (sent < n_beats) begin
            r = $fread(beat, fb);
            in_valid = 1;
            sent = sent + 1;
        end else in_valid = 0;
        if (got32 == n_tiles && gotm == n_jobs && sent == n_beats) begin
            $fwrite(fo, "cycles %0d\n", cyc);
            $fclose(fo);
            $finish;
        end
    end
endmodule
