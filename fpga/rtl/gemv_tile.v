// GEMV tile: P output lanes x W elements per beat, ACC_W-bit accumulators, then per-lane requantization.
// int8 x int8 with X_W = 8, ACC_W = 32 (the decoder matrices, attention scores q.k); X_W = 17, ACC_W = 48
// for attention's P.V (Q0.15 probabilities in [0, 32768] x int8 V, accumulated over the context).
// A tile streams K/W beats back to back or with gaps (in_valid); in_last marks the tile's last beat.
// Lane p accumulates sum_k x[k] * w[p][k]; on the last beat the accumulators go to `requant` with the
// per-lane bias / M / S presented with that beat. Mirrors int8_matmul (int_matmul) + requantize.
// Packing: x[X_W*i +: X_W] = element i of the beat (signed); w[8*(p*W + i) +: 8] = weight of lane p, element i.
// Pipeline: product regs -> adder-tree regs -> accumulator (3 stages) -> requant (3 stages). II = 1 beat.
module gemv_tile #(
    parameter P     = 4,
    parameter W     = 8,
    parameter X_W   = 8,
    parameter ACC_W = 32
) (
    input  wire             clk,
    input  wire             rst,
    input  wire             in_valid,
    input  wire             in_last,
    input  wire [X_W*W-1:0] x,
    input  wire [8*P*W-1:0] w,
    input  wire [32*P-1:0]  bias,
    input  wire [15*P-1:0]  mult,
    input  wire [6*P-1:0]   shift,
    output reg              acc_valid,
    output reg  [ACC_W*P-1:0] acc,
    output wire             out_valid,
    output wire [8*P-1:0]   y
);
    localparam PR_W   = X_W + 8;
    localparam TREE_W = PR_W + $clog2(W) + 1;

    // stage 1: products (one per MAC; P*W multipliers)
    reg                 v1, last1, v2, last2;
    reg  [PR_W*P*W-1:0] prod1;
    reg  [TREE_W*P-1:0] tree2;
    reg  [32*P-1:0]     bias1, bias2, bias3;
    reg  [15*P-1:0]     mult1, mult2, mult3;
    reg  [6*P-1:0]      shift1, shift2, shift3;
    reg                 first2;   // next accumulated beat starts a tile
    integer p, i;
    reg signed [TREE_W-1:0] s;

    always @(posedge clk) begin
        v1 <= in_valid; last1 <= in_last;
        bias1 <= bias; mult1 <= mult; shift1 <= shift;
        for (p = 0; p < P; p = p + 1)
            for (i = 0; i < W; i = i + 1)
                prod1[PR_W*(p*W+i) +: PR_W] <= $signed(x[X_W*i +: X_W]) * $signed(w[8*(p*W+i) +: 8]);
        // stage 2: adder tree per lane
        v2 <= v1; last2 <= last1;
        bias2 <= bias1; mult2 <= mult1; shift2 <= shift1;
        for (p = 0; p < P; p = p + 1) begin
            s = 0;
            for (i = 0; i < W; i = i + 1)
                s = s + $signed(prod1[PR_W*(p*W+i) +: PR_W]);
            tree2[TREE_W*p +: TREE_W] <= s;
        end
        // stage 3: accumulate
        acc_valid <= v2 && last2;
        if (v2) begin
            for (p = 0; p < P; p = p + 1)
                acc[ACC_W*p +: ACC_W] <= (first2 ? $signed({ACC_W{1'b0}}) : $signed(acc[ACC_W*p +: ACC_W]))
                                   + $signed(tree2[TREE_W*p +: TREE_W]);
            first2 <= last2;
        end
        bias3 <= bias2; mult3 <= mult2; shift3 <= shift2;
        if (rst) begin
            v1 <= 1'b0; v2 <= 1'b0; acc_valid <= 1'b0; first2 <= 1'b1;
        end
    end

    genvar g;
    generate
        for (g = 0; g < P; g = g + 1) begin : lane
            wire vo;
            requant #(.ACC_W(ACC_W)) rq (
                .clk(clk), .in_valid(acc_valid), .acc(acc[ACC_W*g +: ACC_W]), .bias(bias3[32*g +: 32]),
                .mult(mult3[15*g +: 15]), .shift(shift3[6*g +: 6]), .out_valid(vo), .y(y[8*g +: 8]));
            if (g == 0) begin : v
                assign out_valid = vo;
            end
        end
    endgenerate
endmodule
