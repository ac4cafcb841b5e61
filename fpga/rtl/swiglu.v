// The SwiGLU hidden value: h = sat8(round_half_up(silu_lut(gate) * up * M / 2**S)), W lanes.
// Mirrors integer_model's `requantize(lut_apply(gate, silu_table) * up, M, S)`: the SiLU table
// (silu_lut, one 256-entry ROM per lane, per layer) then an int8 x int8 product into `requant`.
// Pipeline: silu_lut (2) -> product into requant (3); II = 1.
module swiglu #(
    parameter W        = 8,
    parameter LUT_FILE = "silu.hex"
) (
    input  wire           clk,
    input  wire           rst,
    input  wire           in_valid,
    input  wire [8*W-1:0] gate,
    input  wire [8*W-1:0] up,
    input  wire [14:0]    mult,
    input  wire [5:0]     shift,
    output wire           out_valid,
    output wire [8*W-1:0] y
);
    wire          sv;
    wire [8*W-1:0] sg;
    reg  [8*W-1:0] up1, up2;
    always @(posedge clk) begin
        up1 <= up; up2 <= up1;
    end
    silu_lut #(.W(W), .LUT_FILE(LUT_FILE)) lut (
        .clk(clk), .rst(rst), .in_valid(in_valid), .x(gate), .out_valid(sv), .y(sg));
    genvar g;
    generate
        for (g = 0; g < W; g = g + 1) begin : lane
            wire               vo;
            wire signed [31:0] prod = $signed(sg[8*g +: 8]) * $signed(up2[8*g +: 8]);
            requant #(.ACC_W(32)) rq (
                .clk(clk), .in_valid(sv), .acc(prod), .bias(32'sd0), .mult(mult), .shift(shift),
                .out_valid(vo), .y(y[8*g +: 8]));
            if (g == 0) begin : v
                assign out_valid = vo;
            end
        end
    endgenerate
endmodule
