// Argmax over a streamed vector, W values per beat, lowest index on ties. Mirrors argmax_lowest.
// A vector is any number of beats (in_valid may gap); in_last marks its last beat. Index of lane i
// in beat b is b*W + i. Ties: inside a beat the lower lane wins; across beats a later beat replaces
// the running best only when strictly greater. Pipeline: in regs -> beat tree -> running best (3); II = 1.
module argmax_stream #(
    parameter W     = 4,
    parameter VAL_W = 32,
    parameter IDX_W = 16
) (
    input  wire               clk,
    input  wire               rst,
    input  wire               in_valid,
    input  wire               in_last,
    input  wire [VAL_W*W-1:0] vals,
    output reg                out_valid,
    output reg  [IDX_W-1:0]   out_index,
    output reg  [VAL_W-1:0]   out_value
);
    reg               v1, last1, v2, last2, first;
    reg [VAL_W*W-1:0] vals1;
    reg [IDX_W-1:0]   base1, base2, beat_base;
    reg [VAL_W-1:0]   bval2, best_val;
    reg [IDX_W-1:0]   bidx2, best_idx;

    // beat tree, written as a linear scan: strictly-greater keeps the lowest lane on ties
    reg signed [VAL_W-1:0] tv;
    reg        [IDX_W-1:0] ti;
    integer i;
    always @(*) begin
        tv = $signed(vals1[0 +: VAL_W]);
        ti = 0;
        for (i = 1; i < W; i = i + 1)
            if ($signed(vals1[VAL_W*i +: VAL_W]) > tv) begin
                tv = $signed(vals1[VAL_W*i +: VAL_W]);
                ti = i;
            end
    end

    wire take = first || ($signed(bval2) > $signed(best_val));

    always @(posedge clk) begin
        v1 <= in_valid; last1 <= in_last; vals1 <= vals;
        base1 <= beat_base;
        if (in_valid) beat_base <= in_last ? {IDX_W{1'b0}} : beat_base + W;
        v2 <= v1; last2 <= last1; bval2 <= tv; bidx2 <= base1 + ti;
        out_valid <= v2 && last2;
        if (v2) begin
            if (take) begin
                best_val <= bval2;
                best_idx <= bidx2;
            end
            first <= last2;
            if (last2) begin
                out_value <= take ? bval2 : best_val;
                out_index <= take ? bidx2 : best_idx;
            end
        end
        if (rst) begin
            v1 <= 1'b0; v2 <= 1'b0; out_valid <= 1'b0; first <= 1'b1; beat_base <= {IDX_W{1'b0}};
        end
    end
endmodule
