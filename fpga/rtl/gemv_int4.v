// int4 GEMV tile with uint8 group scales: P output lanes x W int4 weights per beat, 48-bit accumulators.
// Mirrors fixed_point.int4_group_matmul: acc[p] = sum_g gs[p][g] * sum_{k in g} x[k] * w[p][k].
// A tile is K/W beats (in_last on the last); a group is G/W beats (in_glast on its last; W divides G),
// and the P group scales of that group are presented with its last beat. The accumulators go to the
// requant / requant32 lanes (ACC_W = 48), as gemv_tile's do.
// Packing: x[8*i +: 8] = element i; w[4*(p*W + i) +: 4] = weight of lane p, element i (signed nibble);
// gs[8*p +: 8] = lane p's scale (unsigned). Pipeline: products -> adder tree -> group dot -> scaled
// accumulate (4 stages); II = 1 beat.
module gemv_int4 #(
    parameter P = 4,
    parameter W = 8
) (
    input  wire             clk,
    input  wire             rst,
    input  wire             in_valid,
    input  wire             in_glast,
    input  wire             in_last,
    input  wire [8*W-1:0]   x,
    input  wire [4*P*W-1:0] w,
    input  wire [8*P-1:0]   gs,
    output reg              acc_valid,
    output reg  [48*P-1:0]  acc
);
    localparam TREE_W = 12 + $clog2(W) + 1;
    localparam DOT_W  = 32;

    reg                 v1, gl1, last1, v2, gl2, last2, gv3, last3;
    reg  [12*P*W-1:0]   prod1;
    reg  [TREE_W*P-1:0] tree2;
    reg  [DOT_W*P-1:0]  dot3;
    reg  [8*P-1:0]      gs1, gs2, gs3;
    reg                 gfirst, afirst;
    reg signed [TREE_W-1:0] s;
    integer p, i;

    always @(posedge clk) begin
        // 1: products int8 x int4 (|x w| <= 1024)
        v1 <= in_valid; gl1 <= in_glast; last1 <= in_last; gs1 <= gs;
        for (p = 0; p < P; p = p + 1)
            for (i = 0; i < W; i = i + 1)
                prod1[12*(p*W+i) +: 12] <= $signed(x[8*i +: 8]) * $signed(w[4*(p*W+i) +: 4]);
        // 2: adder tree per lane
        v2 <= v1; gl2 <= gl1; last2 <= last1; gs2 <= gs1;
        for (p = 0; p < P; p = p + 1) begin
            s = 0;
            for (i = 0; i < W; i = i + 1)
                s = s + $signed(prod1[12*(p*W+i) +: 12]);
            tree2[TREE_W*p +: TREE_W] <= s;
        end
        // 3: group dot
        gv3 <= v2 && gl2; last3 <= last2; gs3 <= gs2;
        if (v2) begin
            for (p = 0; p < P; p = p + 1)
                dot3[DOT_W*p +: DOT_W] <= (gfirst ? $signed({DOT_W{1'b0}}) : $signed(dot3[DOT_W*p +: DOT_W]))
                                          + $signed(tree2[TREE_W*p +: TREE_W]);
            gfirst <= gl2;
        end
        // 4: acc += dot * group scale
        acc_valid <= gv3 && last3;
        if (gv3) begin
            for (p = 0; p < P; p = p + 1)
                acc[48*p +: 48] <= (afirst ? $signed(48'd0) : $signed(acc[48*p +: 48]))
                                   + $signed(dot3[DOT_W*p +: DOT_W]) * $signed({1'b0, gs3[8*p +: 8]});
            afirst <= last3;
        end
        if (rst) begin
            v1 <= 1'b0; v2 <= 1'b0; gv3 <= 1'b0; acc_valid <= 1'b0; gfirst <= 1'b1; afirst <= 1'b1;
        end
    end
endmodule
