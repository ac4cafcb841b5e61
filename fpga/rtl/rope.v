// RoPE rotation, W (x1, x2) pairs per beat, half-split rotate_half convention. Mirrors rope_apply:
//   o1 = sat8(round((x1 cos - x2 sin) / 2**14)),  o2 = sat8(round((x2 cos + x1 sin) / 2**14))
// x1 = element j, x2 = element j + hd/2 of one head; cos/sin are Q1.14 int16 from the position's table
// row (rope_tables_q14; on a board they sit in BRAM indexed by position). Pipeline: 4 products ->
// sums, round, saturate (2 stages); II = 1.
module rope #(
    parameter W = 8
) (
    input  wire            clk,
    input  wire            rst,
    input  wire            in_valid,
    input  wire [8*W-1:0]  x1,
    input  wire [8*W-1:0]  x2,
    input  wire [16*W-1:0] cos_q,
    input  wire [16*W-1:0] sin_q,
    output reg             out_valid,
    output reg  [8*W-1:0]  o1,
    output reg  [8*W-1:0]  o2
);
    reg         v1;
    reg [24*W-1:0] ac, bs, bc, as;   // x1 cos, x2 sin, x2 cos, x1 sin
    reg signed [25:0] s1, s2;
    integer i;

    function [7:0] sat8(input signed [25:0] v);
        sat8 = (v > 127) ? 8'sd127 : (v < -128) ? -8'sd128 : v[7:0];
    endfunction

    always @(posedge clk) begin
        v1 <= in_valid;
        for (i = 0; i < W; i = i + 1) begin
            ac[24*i +: 24] <= $signed(x1[8*i +: 8]) * $signed(cos_q[16*i +: 16]);
            bs[24*i +: 24] <= $signed(x2[8*i +: 8]) * $signed(sin_q[16*i +: 16]);
            bc[24*i +: 24] <= $signed(x2[8*i +: 8]) * $signed(cos_q[16*i +: 16]);
            as[24*i +: 24] <= $signed(x1[8*i +: 8]) * $signed(sin_q[16*i +: 16]);
        end
        out_valid <= v1;
        for (i = 0; i < W; i = i + 1) begin
            s1 = ($signed(ac[24*i +: 24]) - $signed(bs[24*i +: 24]) + 26'sd8192) >>> 14;
            s2 = ($signed(bc[24*i +: 24]) + $signed(as[24*i +: 24]) + 26'sd8192) >>> 14;
            o1[8*i +: 8] <= sat8(s1);
            o2[8*i +: 8] <= sat8(s2);
        end
        if (rst) begin
            v1 <= 1'b0; out_valid <= 1'b0;
        end
    end
endmodule
